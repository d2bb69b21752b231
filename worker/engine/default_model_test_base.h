// Test fixture base: the default model's weights and tokenizer, loaded once
// per test suite (a missing model fails the suite, naming scripts/setup.sh).
#ifndef BATON_WORKER_ENGINE_DEFAULT_MODEL_TEST_BASE_H_
#define BATON_WORKER_ENGINE_DEFAULT_MODEL_TEST_BASE_H_

#include "common/test_util.h"
#include "gtest/gtest.h"
#include "model/tokenizer/tokenizer.h"
#include "worker/engine/model_weights.h"

namespace baton::testing {

class DefaultModelTest : public ::testing::Test {
 protected:
  // Derived suites with more to set up call these first / last.
  static void SetUpTestSuite() {
    auto weights = ModelWeights::Open(DefaultModelPath());
    ASSERT_TRUE(weights.ok())
        << weights.status() << " (run scripts/setup.sh to fetch the model)";
    weights_ = weights->release();
    auto tokenizer = Tokenizer::FromGguf(*weights_->gguf());
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = tokenizer->release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete weights_;
    tokenizer_ = nullptr;
    weights_ = nullptr;
  }

  static inline ModelWeights* weights_ = nullptr;
  static inline Tokenizer* tokenizer_ = nullptr;
};

}  // namespace baton::testing

#endif  // BATON_WORKER_ENGINE_DEFAULT_MODEL_TEST_BASE_H_
