// The default model loaded from an HF safetensors checkpoint (written from
// the GGUF by scripts/reference/gguf_to_hf.py: float32 weights, HF names,
// rotate-half Q/K order) must compute the same function as the exact float64
// reference of the GGUF: this checks HF names, config.json and the RoPE
// convention end to end.
#include "worker/engine/model_weights.h"

#include <cmath>
#include <sstream>

#include "common/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/model_runner.h"

namespace baton {
namespace {

std::vector<float> AllLogits(const ModelWeights& w,
                             const std::vector<int32_t>& tokens) {
  KvCacheOptions o;
  o.num_layers = w.config().num_layers;
  o.num_kv_heads = w.config().num_kv_heads;
  o.head_dim = w.config().head_dim;
  o.num_blocks = 8;
  auto cache = KvCache::Create(o);
  EXPECT_TRUE(cache.ok());
  ThreadPoolOptions po;
  po.num_threads = 2;
  auto pool = ThreadPool::Create(po);
  auto runner = ModelRunner::Create(&w, cache->get(), pool->get());
  EXPECT_TRUE(runner.ok()) << runner.status();
  BlockTable table;
  EXPECT_TRUE((*cache)->Reserve(table, tokens.size()).ok());
  std::vector<float> logits;
  ForwardItem item{&table, 0, tokens, LogitsMode::kAll};
  EXPECT_TRUE((*runner)->Forward({&item, 1}, &logits).ok());
  (*cache)->Free(table);
  return logits;
}

TEST(ModelWeightsTest, HfCheckpointMatchesFloat64ReferenceOfGguf) {
  const std::string dir = ::testing::TempDir() + "/hf_default_model";
  const std::string model = testing::DefaultModelPath();
  auto made = testing::RunCommand(
      testing::PythonPath() + " " + testing::SourceDir() +
      "/scripts/reference/gguf_to_hf.py " + model + " " + dir);
  ASSERT_TRUE(made.ok()) << made.status();
  auto hf = ModelWeights::Open(dir);
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ((*hf)->config().rope_style, RopeStyle::kHalfSplit);
  EXPECT_TRUE((*hf)->config().tie_word_embeddings);
  EXPECT_EQ((*hf)->gguf(), nullptr);
  EXPECT_EQ((*hf)->hf_directory(), dir);

  const std::vector<int32_t> tokens = {1,    4093, 198,  1780, 314, 260,
                                       3575, 282,  4649, 47,   2,   198,
                                       1,    520,  9531, 198};
  std::ostringstream cmd;
  cmd << testing::PythonPath() << " " << testing::SourceDir()
      << "/scripts/reference/numpy_forward.py " << model;
  for (int32_t t : tokens) cmd << " " << t;
  auto out = testing::RunCommand(cmd.str());
  ASSERT_TRUE(out.ok()) << out.status();
  const int64_t vocab = (*hf)->config().vocab_size;
  ASSERT_EQ(out->size(), tokens.size() * vocab * sizeof(float));
  const float* exact = reinterpret_cast<const float*>(out->data());
  const std::vector<float> ours = AllLogits(**hf, tokens);
  // float32 weights and activations leave only the f16 KV cache (2^-11
  // relative) and float32 accumulation: logits within a few hundredths.
  double max_delta = 0, sum = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    const double d = std::abs(ours[i] - exact[i]);
    max_delta = std::max(max_delta, d);
    sum += d;
  }
  std::printf(
      "HF float32 checkpoint vs float64 reference: mean |dlogit| %.5f, max "
      "%.4f\n",
      sum / ours.size(), max_delta);
  EXPECT_LT(sum / ours.size(), 0.01);
  EXPECT_LT(max_delta, 0.1);
  std::remove((dir + "/model.safetensors").c_str());
  std::remove((dir + "/config.json").c_str());
}

TEST(ModelWeightsTest, RejectsUnknownPaths) {
  auto w = ModelWeights::Open("/nonexistent/model.bin");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(w.status().message()),
              ::testing::HasSubstr("model.bin"));
  EXPECT_EQ(ModelWeights::Open("/nonexistent/model.gguf").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace baton
