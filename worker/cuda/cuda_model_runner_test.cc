// CudaModelRunner against the CPU ModelRunner on the default model. The
// argument checks run everywhere; everything that needs a device skips
// without one (BATON_SKIP_WITHOUT_CUDA).
#include "worker/cuda/cuda_model_runner.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/float16.h"
#include "kernels/cuda/cuda_test_util.h"
#include "worker/cuda/runner_test_util.h"
#include "worker/engine/default_model_test_base.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

class CudaModelRunnerTest : public testing::DefaultModelTest {
 protected:
  // The precision reference beside the default model: its weights
  // dequantized to f32, run by the CPU runner with f32 activations.
  static void SetUpTestSuite() {
    DefaultModelTest::SetUpTestSuite();
    if (HasFatalFailure()) return;
    ModelWeightsOptions options;
    options.matrices_as_f32 = true;
    auto reference = ModelWeights::Open(testing::DefaultModelPath(), options);
    ASSERT_TRUE(reference.ok()) << reference.status();
    reference_ = reference->release();
  }
  static void TearDownTestSuite() {
    delete reference_;
    reference_ = nullptr;
    DefaultModelTest::TearDownTestSuite();
  }

  static KvLayout Layout() {
    const ModelConfig& c = weights_->config();
    KvLayout layout;
    layout.num_layers = c.num_layers;
    layout.num_kv_heads = c.num_kv_heads;
    layout.head_dim = c.head_dim;
    layout.block_size = 16;
    layout.dtype = DType::kF16;
    return layout;
  }

  static inline ModelWeights* reference_ = nullptr;
};

void PrintComparison(const char* what, const LogitsComparison& c,
                     int64_t rows) {
  std::printf(
      "%s, %lld rows: top-1 agreement %.4f, mean KL %.3g, max KL %.3g, max "
      "|logit diff| %.4g\n",
      what, static_cast<long long>(rows), c.top1_agreement, c.mean_kl, c.max_kl,
      c.max_abs_diff);
  for (const auto& [row, margin] : c.mismatches) {
    std::printf("  top-1 differs at row %lld (reference margin %.4f)\n",
                static_cast<long long>(row), margin);
  }
}

// Each runner is measured against the f32 reference; the GPU's bf16 path
// must come about as close to it as the CPU engine's 8-bit activations do
// (mean KL within 1.5x, at most 1% more rows whose top-1 differs), and its
// error must stay small in absolute terms (mean KL < 0.05 nats).
void ExpectAsPreciseAsTheCpuEngine(const LogitsComparison& gpu,
                                   const LogitsComparison& cpu, int64_t rows,
                                   const char* what) {
  PrintComparison(absl::StrCat(what, ": CPU engine vs f32 reference").c_str(),
                  cpu, rows);
  PrintComparison(absl::StrCat(what, ": GPU vs f32 reference").c_str(), gpu,
                  rows);
  EXPECT_LE(gpu.mean_kl, 1.5 * cpu.mean_kl) << what;
  EXPECT_LE(gpu.mismatches.size(), cpu.mismatches.size() + rows / 100) << what;
  EXPECT_LT(gpu.mean_kl, 0.05) << what;
  EXPECT_TRUE(std::isfinite(gpu.max_abs_diff)) << what;
}

TEST_F(CudaModelRunnerTest, CreateRejectsBadArgumentsBeforeTouchingADevice) {
  const KvLayout good = Layout();
  CudaRunnerOptions options;
  struct Case {
    KvLayout layout;
    int64_t num_blocks;
    CudaRunnerOptions options;
    const char* message;
  };
  std::vector<Case> cases;
  KvLayout layers = good;
  layers.num_layers += 1;
  cases.push_back({layers, 8, options, "does not fit the model"});
  KvLayout f32 = good;
  f32.dtype = DType::kF32;
  cases.push_back({f32, 8, options, "needs an F16 KV cache"});
  cases.push_back({good, 0, options, "num_blocks must be in [1, 2^31 - 1]"});
  CudaRunnerOptions no_tokens;
  no_tokens.max_batch_tokens = 0;
  cases.push_back({good, 8, no_tokens, "max_batch_tokens must be"});
  CudaRunnerOptions no_rows;
  no_rows.max_logits_rows = -1;
  cases.push_back({good, 8, no_rows, "max_logits_rows must be"});
  CudaRunnerOptions no_graph_rows;
  no_graph_rows.max_graph_batch = 0;
  cases.push_back({good, 8, no_graph_rows, "max_graph_batch must be"});
  CudaRunnerOptions bad_device;
  bad_device.device = -1;
  cases.push_back({good, 8, bad_device, "device must be >= 0"});
  auto allocator = MakeAllocator(*weights_, 4);
  ASSERT_NE(allocator, nullptr);
  CudaRunnerOptions other_pool;
  other_pool.allocator = allocator.get();
  cases.push_back({good, 8, other_pool, "differs from the device pool"});
  for (const Case& c : cases) {
    auto runner =
        CudaModelRunner::Create(weights_, c.layout, c.num_blocks, c.options);
    ASSERT_FALSE(runner.ok()) << c.message;
    EXPECT_EQ(runner.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(runner.status().message(), HasSubstr(c.message));
  }
  EXPECT_EQ(CudaModelRunner::Create(nullptr, good, 8, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Without a device Create names the CUDA error; with one, a device index
// beyond the count is rejected. Either way the branch asserts.
TEST_F(CudaModelRunnerTest, CreateNamesAMissingDeviceOrABadIndex) {
  const std::string why = cuda_test::CudaUnavailableReason();
  CudaRunnerOptions options;
  if (!why.empty()) {
    auto runner = CudaModelRunner::Create(weights_, Layout(), 8, options);
    ASSERT_FALSE(runner.ok());
    EXPECT_EQ(runner.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(runner.status().message(), HasSubstr("no usable CUDA device"));
    return;
  }
  options.device = 1 << 20;
  auto runner = CudaModelRunner::Create(weights_, Layout(), 8, options);
  ASSERT_FALSE(runner.ok());
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(runner.status().message(), HasSubstr("CUDA devices"));
}

// The harness of the device comparisons, on the CPU alone (runs
// everywhere): the fixed text has about 200 tokens, and greedy generation
// does not depend on the prefill chunking (the CPU runner is bit-exact
// across chunkings), so Generate schedules chunks and decode steps right.
TEST_F(CudaModelRunnerTest, GenerationHarnessIsChunkingInvariantOnCpu) {
  const std::vector<int32_t> text = tokenizer_->Encode(kTeacherText);
  std::printf("teacher text: %zu tokens\n", text.size());
  EXPECT_GE(text.size(), 150u);
  EXPECT_LE(text.size(), 260u);
  const std::vector<std::vector<int32_t>> prompts = {
      std::vector<int32_t>(text.begin(), text.begin() + 9),
      std::vector<int32_t>(text.begin() + 40, text.begin() + 75)};
  auto cpu = MakeCpuForward(weights_, 16);
  ASSERT_NE(cpu, nullptr);
  const int64_t vocab = weights_->config().vocab_size;
  const Generation whole =
      Generate(*cpu->cache, cpu->Fn(), prompts, 1000, 3, vocab);
  const Generation chunked =
      Generate(*cpu->cache, cpu->Fn(), prompts, 8, 3, vocab);
  ASSERT_TRUE(whole.status.ok()) << whole.status;
  ASSERT_TRUE(chunked.status.ok()) << chunked.status;
  ASSERT_EQ(whole.tokens.size(), 2u);
  EXPECT_EQ(whole.tokens[0].size(), 3u);
  EXPECT_EQ(whole.tokens, chunked.tokens);
  EXPECT_EQ(whole.logits, chunked.logits);
  EXPECT_EQ(cpu->cache->num_blocks_free(), cpu->cache->num_blocks_total());
  const LogitsComparison self =
      CompareLogits(whole.logits[1][0], chunked.logits[1][0], 1, vocab);
  EXPECT_EQ(self.top1_agreement, 1.0);
  EXPECT_NEAR(self.mean_kl, 0.0, 1e-12);
}

TEST_F(CudaModelRunnerTest, ForwardRejectsBadItemsAndStaysHealthy) {
  BATON_SKIP_WITHOUT_CUDA();
  auto allocator = MakeAllocator(*weights_, 4);
  ASSERT_NE(allocator, nullptr);
  CudaRunnerOptions options;
  options.allocator = allocator.get();
  options.max_batch_tokens = 16;
  auto runner =
      CudaModelRunner::Create(weights_, allocator->layout(), 4, options);
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_GE((*runner)->pool_bytes(), 4 * (*runner)->chunk_bytes());
  BlockTable table;
  ASSERT_TRUE(allocator->Reserve(table, 32).ok());
  std::vector<float> logits;
  const std::vector<int32_t> bad = {1, 49152};
  ForwardItem bad_item{&table, 0, bad, LogitsMode::kLast};
  EXPECT_EQ((*runner)->Forward({&bad_item, 1}, &logits).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> ok = {1, 2};
  ForwardItem wrong_start{&table, 3, ok, LogitsMode::kLast};
  EXPECT_EQ((*runner)->Forward({&wrong_start, 1}, &logits).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> too_many(17, 1);
  ForwardItem big{&table, 0, too_many, LogitsMode::kLast};
  EXPECT_THAT((*runner)->Forward({&big, 1}, &logits).message(),
              HasSubstr("max_batch_tokens"));
  ForwardItem good{&table, 0, ok, LogitsMode::kLast};
  EXPECT_EQ((*runner)->Forward({&good, 1}, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table.num_tokens(), 0);
  EXPECT_TRUE((*runner)->healthy());
  // A valid step after the rejected ones works and commits its tokens.
  ASSERT_TRUE((*runner)->Forward({&good, 1}, &logits).ok());
  EXPECT_EQ(table.num_tokens(), 2);
  EXPECT_EQ(logits.size(), 49152u);
  EXPECT_TRUE(std::all_of(logits.begin(), logits.end(),
                          [](float x) { return std::isfinite(x); }));
  allocator->Free(table);
}

// Teacher-forced logits of the whole text on three runners: the precision
// reference (CPU, f32 weights and activations), the CPU engine (8-bit
// activations) and the GPU (bf16 weights and GEMM inputs, f32 accumulation).
TEST_F(CudaModelRunnerTest, TeacherForcedLogitsMatchTheReference) {
  BATON_SKIP_WITHOUT_CUDA();
  const std::vector<int32_t> tokens = tokenizer_->Encode(kTeacherText);
  ASSERT_GE(tokens.size(), 150u) << "the fixed text is too short";
  const ModelConfig& c = weights_->config();
  const int64_t vocab = c.vocab_size;
  const int64_t blocks = (static_cast<int64_t>(tokens.size()) + 15) / 16 + 2;

  auto cpu = MakeCpuForward(weights_, blocks);
  auto ref = MakeCpuForward(reference_, blocks);
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(ref, nullptr);
  BlockTable cpu_table, ref_table;
  ASSERT_TRUE(cpu->cache->Reserve(cpu_table, tokens.size()).ok());
  ASSERT_TRUE(ref->cache->Reserve(ref_table, tokens.size()).ok());
  std::vector<float> cpu_logits, ref_logits;
  const ForwardItem cpu_item{&cpu_table, 0, tokens, LogitsMode::kAll};
  const ForwardItem ref_item{&ref_table, 0, tokens, LogitsMode::kAll};
  ASSERT_TRUE(cpu->runner->Forward({&cpu_item, 1}, &cpu_logits).ok());
  ASSERT_TRUE(ref->runner->Forward({&ref_item, 1}, &ref_logits).ok());

  // 64 logit rows per LM-head pass: several passes and a partial one.
  auto gpu = MakeGpuForward(weights_, blocks, /*max_batch_tokens=*/512,
                            /*max_logits_rows=*/64);
  ASSERT_NE(gpu, nullptr);
  BlockTable gpu_table;
  ASSERT_TRUE(gpu->allocator->Reserve(gpu_table, tokens.size()).ok());
  std::vector<float> gpu_logits;
  std::vector<int64_t> layers_done;
  const ForwardItem gpu_item{&gpu_table, 0, tokens, LogitsMode::kAll};
  const absl::Status status =
      gpu->runner->Forward({&gpu_item, 1}, &gpu_logits,
                           [&](int64_t l) { layers_done.push_back(l); });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(gpu->runner->healthy());
  EXPECT_EQ(gpu_table.num_tokens(), static_cast<int64_t>(tokens.size()));
  ASSERT_EQ(static_cast<int64_t>(layers_done.size()), c.num_layers);
  for (int64_t l = 0; l < c.num_layers; ++l) EXPECT_EQ(layers_done[l], l);
  ASSERT_EQ(gpu_logits.size(), ref_logits.size());
  ASSERT_EQ(cpu_logits.size(), ref_logits.size());

  const int64_t rows = static_cast<int64_t>(tokens.size());
  const LogitsComparison gpu_cmp =
      CompareLogits(ref_logits, gpu_logits, rows, vocab);
  const LogitsComparison cpu_cmp =
      CompareLogits(ref_logits, cpu_logits, rows, vocab);
  PrintComparison("teacher forced: GPU vs CPU engine",
                  CompareLogits(cpu_logits, gpu_logits, rows, vocab), rows);
  ExpectAsPreciseAsTheCpuEngine(gpu_cmp, cpu_cmp, rows, "teacher forced");
  // For the GPU check's table: the share of positions whose top-1 differs
  // from the reference, bounded by the CPU engine's; mean KL likewise.
  std::printf(
      "BATON_KERNEL_ERROR op=whole_model_top1 case=smollm2_teacher_forced "
      "max_abs=%.6g atol=%.6g rtol=0\n",
      1.0 - gpu_cmp.top1_agreement, 1.0 - cpu_cmp.top1_agreement);
  std::printf(
      "BATON_KERNEL_ERROR op=whole_model_kl case=smollm2_teacher_forced "
      "max_abs=%.6g atol=%.6g rtol=0\n",
      gpu_cmp.mean_kl, 1.5 * cpu_cmp.mean_kl);
  ref->cache->Free(ref_table);

  // The K/V of layer 0 in the device pool, read back in the pool layout,
  // against the CPU cache's. Tolerance: atol = 2% of the largest |value|
  // plus rtol 2% (bf16 embedding, weights and GEMM inputs), far below what
  // a slot, head or block mix-up gives.
  const KvLayout layout = gpu->runner->layout();
  std::vector<uint16_t> pool(gpu->runner->num_blocks() *
                             gpu->runner->chunk_bytes() / 2);
  BATON_ASSERT_CUDA_OK(cudaMemcpy(pool.data(), gpu->runner->pool(),
                                  pool.size() * 2, cudaMemcpyDeviceToHost));
  const int64_t kv_dim = layout.kv_dim();
  const int64_t half_chunk = kv_dim * layout.block_size;
  std::vector<float> got, want, k(kv_dim), v(kv_dim);
  for (int64_t p = 0; p < static_cast<int64_t>(tokens.size()); ++p) {
    cpu->cache->ReadKv(cpu_table, 0, p, k.data(), v.data());
    const int64_t block = gpu_table.block_ids()[p / layout.block_size];
    const int64_t slot = p % layout.block_size;
    for (int64_t kv = 0; kv < 2; ++kv) {
      for (int64_t h = 0; h < layout.num_kv_heads; ++h) {
        for (int64_t d = 0; d < layout.head_dim; ++d) {
          const int64_t index =
              (block * 2 + kv) * half_chunk +
              (h * layout.block_size + slot) * layout.head_dim + d;
          got.push_back(F16ToF32(pool[index]));
          want.push_back((kv == 0 ? k : v)[h * layout.head_dim + d]);
        }
      }
    }
  }
  float largest = 0;
  for (float x : want) largest = std::max(largest, std::fabs(x));
  const cuda_test::MaxError err = cuda_test::ExpectAllClose(
      got, want, 0.02 * largest, 0.02, "layer 0 K/V in the device pool");
  std::printf(
      "BATON_KERNEL_ERROR op=whole_model_kv_layer0 case=smollm2_%zu_tokens "
      "max_abs=%.6g atol=%.4g rtol=0.02\n",
      tokens.size(), err.abs, 0.02 * largest);

  cpu->cache->Free(cpu_table);
  gpu->allocator->Free(gpu_table);
}

// Chunked prefill (chunks of 16, several prompts per step) then batched
// decode steps on three runners, the reference generating greedily and the
// CPU engine and the GPU fed the reference's tokens (so their logits stay
// comparable row by row however near a tie they pass). The longest prompt
// passes 256 cached tokens, so the decode kernel's split path runs.
TEST_F(CudaModelRunnerTest, ChunkedPrefillAndDecodeMatchTheReference) {
  BATON_SKIP_WITHOUT_CUDA();
  std::vector<int32_t> text = tokenizer_->Encode(kTeacherText);
  ASSERT_GE(text.size(), 150u);
  std::vector<int32_t> doubled = text;
  doubled.insert(doubled.end(), text.begin(), text.end());
  const std::vector<std::vector<int32_t>> prompts = {
      std::vector<int32_t>(text.begin(), text.begin() + 17),
      std::vector<int32_t>(text.begin() + 30, text.begin() + 120),
      std::vector<int32_t>(doubled.begin(), doubled.begin() + 270)};
  constexpr int64_t kChunk = 16, kSteps = 12, kBlocks = 64;
  const int64_t vocab = weights_->config().vocab_size;
  auto ref = MakeCpuForward(reference_, kBlocks);
  auto cpu = MakeCpuForward(weights_, kBlocks);
  auto gpu = MakeGpuForward(weights_, kBlocks, 64, 64);
  ASSERT_NE(ref, nullptr);
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(gpu, nullptr);
  const Generation want =
      Generate(*ref->cache, ref->Fn(), prompts, kChunk, kSteps, vocab);
  ASSERT_TRUE(want.status.ok()) << want.status;
  const Generation cpu_run = Generate(*cpu->cache, cpu->Fn(), prompts, kChunk,
                                      kSteps, vocab, &want.tokens);
  const Generation got = Generate(*gpu->allocator, gpu->Fn(), prompts, kChunk,
                                  kSteps, vocab, &want.tokens);
  ASSERT_TRUE(cpu_run.status.ok()) << cpu_run.status;
  ASSERT_TRUE(got.status.ok()) << got.status;
  EXPECT_EQ(gpu->allocator->num_blocks_free(),
            gpu->allocator->num_blocks_total());
  const int64_t rows = static_cast<int64_t>(prompts.size()) * kSteps;
  const std::vector<float> ref_rows = FlattenRows(want.logits);
  ASSERT_EQ(FlattenRows(got.logits).size(), ref_rows.size());
  ExpectAsPreciseAsTheCpuEngine(
      CompareLogits(ref_rows, FlattenRows(got.logits), rows, vocab),
      CompareLogits(ref_rows, FlattenRows(cpu_run.logits), rows, vocab), rows,
      "chunked prefill + decode");
}

}  // namespace
}  // namespace baton
