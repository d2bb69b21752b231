#include "worker/engine/model_runner.h"

#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "common/test_util.h"
#include "gtest/gtest.h"
#include "worker/engine/default_model_test_base.h"
#include "worker/engine/logits_test_util.h"

namespace baton {
namespace {

// Deterministic pseudo-random token ids.
std::vector<int32_t> Tokens(int64_t n, uint32_t seed) {
  std::vector<int32_t> out(n);
  uint32_t s = seed;
  for (int32_t& t : out) {
    s = s * 1664525u + 1013904223u;
    t = static_cast<int32_t>((s >> 8) % 49152);
  }
  return out;
}

class ModelRunnerTest : public testing::DefaultModelTest {
 protected:
  static void SetUpTestSuite() {
    DefaultModelTest::SetUpTestSuite();
    if (HasFatalFailure()) return;
    ThreadPoolOptions pool_options;
    pool_options.num_threads = 2;
    pool_ = ThreadPool::Create(pool_options)->release();
  }
  static void TearDownTestSuite() {
    delete pool_;
    DefaultModelTest::TearDownTestSuite();
  }

  std::unique_ptr<KvCache> MakeCache(int64_t num_blocks) {
    const ModelConfig& c = weights_->config();
    KvCacheOptions options;
    options.num_layers = c.num_layers;
    options.num_kv_heads = c.num_kv_heads;
    options.head_dim = c.head_dim;
    options.num_blocks = num_blocks;
    auto cache = KvCache::Create(options);
    EXPECT_TRUE(cache.ok()) << cache.status();
    return std::move(*cache);
  }

  // Logits of every position of `tokens`, fed in chunks of `chunk` tokens,
  // batched with `others` (each prefilled alongside in one go), through
  // `weights` (default: the fixture's).
  std::vector<float> AllLogits(
      const std::vector<int32_t>& tokens, int64_t chunk,
      const std::vector<std::vector<int32_t>>& others = {},
      const ModelWeights* weights = nullptr, CpuIsa isa = BestCpuIsa()) {
    auto cache = MakeCache(64);
    auto runner = ModelRunner::Create(weights != nullptr ? weights : weights_,
                                      cache.get(), pool_, isa);
    EXPECT_TRUE(runner.ok()) << runner.status();
    BlockTable table;
    EXPECT_TRUE(cache->Reserve(table, tokens.size()).ok());
    std::vector<BlockTable> other_tables(others.size());
    std::vector<float> result, logits;
    for (size_t start = 0; start < tokens.size(); start += chunk) {
      size_t n = std::min<size_t>(chunk, tokens.size() - start);
      std::vector<ForwardItem> items;
      // The sequence under test sits between the others, first chunk only.
      size_t mid = start == 0 ? others.size() / 2 : 0;
      for (size_t o = 0; o < mid; ++o) {
        EXPECT_TRUE(cache->Reserve(other_tables[o], others[o].size()).ok());
        items.push_back({&other_tables[o], 0, others[o], LogitsMode::kLast});
      }
      items.push_back({&table, static_cast<int64_t>(start),
                       std::span<const int32_t>(tokens).subspan(start, n),
                       LogitsMode::kAll});
      for (size_t o = mid; start == 0 && o < others.size(); ++o) {
        EXPECT_TRUE(cache->Reserve(other_tables[o], others[o].size()).ok());
        items.push_back({&other_tables[o], 0, others[o], LogitsMode::kLast});
      }
      absl::Status status = (*runner)->Forward(items, &logits);
      EXPECT_TRUE(status.ok()) << status;
      const int64_t vocab = weights_->config().vocab_size;
      const int64_t offset = start == 0 ? mid * vocab : 0;
      result.insert(result.end(), logits.begin() + offset,
                    logits.begin() + offset + n * vocab);
    }
    for (BlockTable& t : other_tables) cache->Free(t);
    cache->Free(table);
    EXPECT_EQ(cache->num_blocks_free(), cache->num_blocks_total());
    return result;
  }

  static ThreadPool* pool_;
};

ThreadPool* ModelRunnerTest::pool_ = nullptr;

TEST_F(ModelRunnerTest, LogitsAreFiniteAndVaried) {
  std::vector<float> logits = AllLogits(Tokens(8, 1), 8);
  ASSERT_EQ(logits.size(), 8u * 49152);
  float lo = logits[0], hi = logits[0];
  for (float x : logits) {
    ASSERT_TRUE(std::isfinite(x));
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  EXPECT_GT(hi - lo, 5.0f);
}

// Chunked prefill, decode steps (chunk 1) and batching with other sequences
// must not change a single bit of a sequence's logits.
TEST_F(ModelRunnerTest, BitIdenticalAcrossChunkingAndBatching) {
  const std::vector<int32_t> tokens = Tokens(45, 7);
  const std::vector<float> whole = AllLogits(tokens, tokens.size());
  for (int64_t chunk : {1, 7, 16}) {
    std::vector<float> chunked = AllLogits(tokens, chunk);
    ASSERT_EQ(chunked.size(), whole.size());
    EXPECT_EQ(0, std::memcmp(chunked.data(), whole.data(), whole.size() * 4))
        << "chunk " << chunk;
  }
  std::vector<std::vector<int32_t>> others;
  for (int i = 0; i < 5; ++i) others.push_back(Tokens(3 + 11 * i, 100 + i));
  std::vector<float> batched = AllLogits(tokens, tokens.size(), others);
  ASSERT_EQ(batched.size(), whole.size());
  EXPECT_EQ(0, std::memcmp(batched.data(), whole.data(), whole.size() * 4));
}

// A cache exported layer by layer and imported into another pool continues
// exactly as the original: the cluster's KV handoff in miniature.
TEST_F(ModelRunnerTest, ExportedCacheContinuesIdentically) {
  const std::vector<int32_t> prompt = Tokens(37, 3);
  const std::vector<int32_t> next = {prompt[5]};
  auto cache_a = MakeCache(16);
  auto cache_b = MakeCache(40);
  auto runner_a = ModelRunner::Create(weights_, cache_a.get(), pool_);
  auto runner_b = ModelRunner::Create(weights_, cache_b.get(), pool_);
  ASSERT_TRUE(runner_a.ok() && runner_b.ok());
  BlockTable a, b, filler;
  ASSERT_TRUE(cache_a->Reserve(a, prompt.size() + 1).ok());
  ASSERT_TRUE(cache_b->Reserve(filler, 50).ok());  // so block ids differ
  ASSERT_TRUE(cache_b->Reserve(b, prompt.size() + 1).ok());
  std::vector<float> logits;
  ForwardItem prefill{&a, 0, prompt, LogitsMode::kLast};
  ASSERT_TRUE((*runner_a)->Forward({&prefill, 1}, &logits).ok());
  const int64_t layers = weights_->config().num_layers;
  for (int64_t l = 0; l < layers; ++l) {
    std::vector<uint8_t> bytes(cache_a->LayerBytes(a));
    ASSERT_TRUE(cache_a->ExportLayer(a, l, bytes).ok());
    ASSERT_TRUE(cache_b->ImportLayer(b, l, prompt.size(), bytes).ok());
  }
  ASSERT_TRUE(cache_b->SetNumTokens(b, prompt.size()).ok());
  std::vector<float> la, lb;
  ForwardItem step_a{&a, static_cast<int64_t>(prompt.size()), next,
                     LogitsMode::kLast};
  ForwardItem step_b{&b, static_cast<int64_t>(prompt.size()), next,
                     LogitsMode::kLast};
  ASSERT_TRUE((*runner_a)->Forward({&step_a, 1}, &la).ok());
  ASSERT_TRUE((*runner_b)->Forward({&step_b, 1}, &lb).ok());
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * 4));
}

// The quantized matmuls' 8-bit activations against the precision reference:
// the same weights dequantized to f32 and multiplied by f32 activations.
// The GPU runner's bf16 path is held to this test's figures
// (cuda_model_runner_test).
TEST_F(ModelRunnerTest, EightBitActivationsStayCloseToTheF32Reference) {
  ModelWeightsOptions options;
  options.matrices_as_f32 = true;
  auto reference = ModelWeights::Open(testing::DefaultModelPath(), options);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ((*reference)->layers()[0].wq.dtype, DType::kF32);
  ASSERT_EQ((*reference)->output().dtype, DType::kF32);
  const std::vector<int32_t> tokens = tokenizer_->Encode(kTeacherText);
  const int64_t n = static_cast<int64_t>(tokens.size());
  const std::vector<float> got = AllLogits(tokens, n);
  const std::vector<float> ref = AllLogits(tokens, n, {}, reference->get());
  ASSERT_EQ(got.size(), ref.size());
  const LogitsComparison cmp =
      CompareLogits(ref, got, n, weights_->config().vocab_size);
  std::printf(
      "8-bit activations vs f32 reference, %lld teacher-forced tokens: top-1 "
      "agreement %.4f, mean KL %.3g, max KL %.3g, max |logit diff| %.4g\n",
      static_cast<long long>(n), cmp.top1_agreement, cmp.mean_kl, cmp.max_kl,
      cmp.max_abs_diff);
  for (const auto& [row, margin] : cmp.mismatches) {
    std::printf("  top-1 differs at position %lld (reference margin %.4f)\n",
                static_cast<long long>(row), margin);
  }
  EXPECT_GE(cmp.top1_agreement, 0.9);
  EXPECT_LT(cmp.mean_kl, 0.05);
}

// The whole forward pass (matmuls, attention with its exp, norms, RoPE)
// gives the same bits on every kernel path this CPU has, prefill chunks and
// decode steps alike: a request moved between hosts with different CPUs
// keeps its tokens.
TEST_F(ModelRunnerTest, LogitsBitIdenticalAcrossIsaPaths) {
  const std::vector<int32_t> tokens = Tokens(21, 5);
  const std::vector<float> scalar =
      AllLogits(tokens, 7, {}, nullptr, CpuIsa::kScalar);
  int paths = 0;
  for (CpuIsa isa : kAllCpuIsas) {
    if (isa == CpuIsa::kScalar || !IsCpuIsaSupported(isa)) continue;
    ++paths;
    const std::vector<float> got = AllLogits(tokens, 7, {}, nullptr, isa);
    ASSERT_EQ(got.size(), scalar.size());
    EXPECT_EQ(0, std::memcmp(got.data(), scalar.data(), got.size() * 4))
        << CpuIsaName(isa) << " differs from scalar";
  }
  std::printf(
      "whole forward: %d vector path(s) compared with scalar (best: %s)\n",
      paths, std::string(CpuIsaName(BestCpuIsa())).c_str());
}

TEST_F(ModelRunnerTest, RejectsBadItems) {
  auto cache = MakeCache(4);
  auto runner = ModelRunner::Create(weights_, cache.get(), pool_);
  ASSERT_TRUE(runner.ok());
  BlockTable table;
  ASSERT_TRUE(cache->Reserve(table, 8).ok());
  std::vector<float> logits;
  std::vector<int32_t> bad = {1, 49152};
  ForwardItem item{&table, 0, bad, LogitsMode::kLast};
  EXPECT_EQ((*runner)->Forward({&item, 1}, &logits).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> ok = {1, 2};
  ForwardItem wrong_start{&table, 3, ok, LogitsMode::kLast};
  EXPECT_EQ((*runner)->Forward({&wrong_start, 1}, &logits).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> long_prompt(100, 1);
  ForwardItem too_long{&table, 0, long_prompt, LogitsMode::kLast};
  EXPECT_EQ((*runner)->Forward({&too_long, 1}, &logits).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table.num_tokens(), 0);
  cache->Free(table);
}

}  // namespace
}  // namespace baton
