// CudaModelRunner's CUDA-graph decode path on the default model: a runner
// with graphs against one without, in lockstep over the same prefill and
// decode tokens. Everything here needs a device and skips without one
// (BATON_SKIP_WITHOUT_CUDA); the host half is decode_graph_plan_test.cc.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/float16.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/paged_attention.h"
#include "worker/cuda/cuda_model_runner.h"
#include "worker/cuda/runner_test_util.h"
#include "worker/engine/default_model_test_base.h"

namespace baton {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kBlocks = 192;

// Per decode step, the logits of the graph runner and of the eager one.
struct StepLogits {
  std::vector<float> graph, eager;
};

// `n` prompts cut from the teacher text (repeated): prompt i has
// 3 + (37 i) % 60 tokens, or `first_len` for i == 0.
std::vector<std::vector<int32_t>> Prompts(const std::vector<int32_t>& text,
                                          int64_t n, int64_t first_len) {
  std::vector<int32_t> doubled = text;
  doubled.insert(doubled.end(), text.begin(), text.end());
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = i == 0 ? first_len : 3 + (37 * i) % 60;
    const int64_t start = (7 * i) % 100;
    prompts.emplace_back(doubled.begin() + start,
                         doubled.begin() + start + len);
  }
  return prompts;
}

// Prefills each prompt alone (eager on both runners), then runs `steps`
// decode steps of all prompts on both, feeding both the eager runner's
// argmax. Tables stay reserved until the fixture frees them.
class DecodeGraphRunnerTest : public testing::DefaultModelTest {
 protected:
  void Lockstep(GpuForward& graph, GpuForward& eager,
                const std::vector<std::vector<int32_t>>& prompts, int64_t steps,
                std::vector<StepLogits>* out) {
    const int64_t vocab = weights_->config().vocab_size;
    const size_t n = prompts.size();
    graph_tables_ = std::vector<BlockTable>(n);
    eager_tables_ = std::vector<BlockTable>(n);
    std::vector<int32_t> next(n);
    for (size_t p = 0; p < n; ++p) {
      const int64_t total = static_cast<int64_t>(prompts[p].size()) + steps;
      ASSERT_TRUE(graph.allocator->Reserve(graph_tables_[p], total).ok());
      ASSERT_TRUE(eager.allocator->Reserve(eager_tables_[p], total).ok());
      std::vector<float> a, b;
      const ForwardItem ga{&graph_tables_[p], 0, prompts[p], LogitsMode::kLast};
      const ForwardItem eb{&eager_tables_[p], 0, prompts[p], LogitsMode::kLast};
      ASSERT_TRUE(graph.runner->Forward({&ga, 1}, &a).ok());
      ASSERT_TRUE(eager.runner->Forward({&eb, 1}, &b).ok());
      next[p] = Argmax(b.data(), vocab);
    }
    for (int64_t s = 0; s < steps; ++s) {
      std::vector<ForwardItem> gi, ei;
      for (size_t p = 0; p < n; ++p) {
        const int64_t pos = static_cast<int64_t>(prompts[p].size()) + s;
        const std::span<const int32_t> token(&next[p], 1);
        gi.push_back({&graph_tables_[p], pos, token, LogitsMode::kLast});
        ei.push_back({&eager_tables_[p], pos, token, LogitsMode::kLast});
      }
      StepLogits step;
      const absl::Status gs = graph.runner->Forward(gi, &step.graph);
      ASSERT_TRUE(gs.ok()) << "step " << s << ": " << gs;
      const absl::Status es = eager.runner->Forward(ei, &step.eager);
      ASSERT_TRUE(es.ok()) << "step " << s << ": " << es;
      ASSERT_EQ(step.graph.size(), n * vocab);
      ASSERT_EQ(step.eager.size(), n * vocab);
      for (size_t p = 0; p < n; ++p) {
        next[p] = Argmax(step.eager.data() + p * vocab, vocab);
      }
      out->push_back(std::move(step));
    }
  }

  // Every pool block outside graph_tables_ is still all zeros in every
  // layer: padding rows wrote nothing.
  void ExpectUntouchedBlocksAreZero(const CudaModelRunner& runner) {
    std::set<int32_t> used;
    for (const BlockTable& t : graph_tables_) {
      used.insert(t.block_ids().begin(), t.block_ids().end());
    }
    std::vector<uint8_t> pool(runner.pool_bytes());
    BATON_ASSERT_CUDA_OK(cudaMemcpy(pool.data(), runner.pool(), pool.size(),
                                    cudaMemcpyDeviceToHost));
    const uint64_t chunk = runner.chunk_bytes();
    int64_t dirty = 0;
    for (int64_t l = 0; l < runner.layout().num_layers; ++l) {
      for (int64_t b = 0; b < runner.num_blocks(); ++b) {
        if (used.count(static_cast<int32_t>(b)) != 0) continue;
        const uint8_t* c = pool.data() + (l * runner.num_blocks() + b) * chunk;
        if (std::any_of(c, c + chunk, [](uint8_t x) { return x != 0; })) {
          ++dirty;
        }
      }
    }
    EXPECT_EQ(dirty, 0) << "chunks of unused blocks were written";
  }

  void FreeTables(GpuForward& graph, GpuForward& eager) {
    for (BlockTable& t : graph_tables_) graph.allocator->Free(t);
    for (BlockTable& t : eager_tables_) eager.allocator->Free(t);
  }

  std::vector<BlockTable> graph_tables_, eager_tables_;
};

// Batches of 1 (no padding: bit-identical), 3 (bucket 4) and 17 (bucket 24)
// after a prefill; prompt 0 has 270 tokens, so the decode attention splits
// (context tier 1024). Padded batches run their GEMMs at M = bucket, so the
// rows may differ from the eager M = n in the last bits; bound: max |logit
// diff| 0.5 and mean KL 1e-3 nats, far below a wrong row or position.
TEST_F(DecodeGraphRunnerTest, GraphDecodeMatchesEagerForBatchesOf1_3_17) {
  BATON_SKIP_WITHOUT_CUDA();
  const std::vector<int32_t> text = tokenizer_->Encode(kTeacherText);
  ASSERT_GE(text.size(), 150u);
  const int64_t vocab = weights_->config().vocab_size;
  constexpr int64_t kSteps = 3;
  for (int64_t n : {1, 3, 17}) {
    SCOPED_TRACE(n);
    auto graph = MakeGpuForward(weights_, kBlocks, 512, 64, true);
    auto eager = MakeGpuForward(weights_, kBlocks, 512, 64, false);
    ASSERT_NE(graph, nullptr);
    ASSERT_NE(eager, nullptr);
    const std::vector<std::vector<int32_t>> prompts = Prompts(text, n, 270);
    std::vector<StepLogits> steps;
    Lockstep(*graph, *eager, prompts, kSteps, &steps);
    if (HasFatalFailure()) return;
    const int64_t bucket = DecodeGraphBucket(n, 64);
    // The first decode step runs the padded batch before the capture.
    EXPECT_EQ(graph->runner->graph_launches(), kSteps - 1);
    EXPECT_EQ(graph->runner->eager_steps(), n + 1);  // prefills, first step
    EXPECT_EQ(eager->runner->graph_launches(), 0);
    EXPECT_EQ(eager->runner->eager_steps(), n + kSteps);
    // Contexts 271 .. 273: tier 1024 (for a context length above it).
    const int64_t bound = DecodeGraphContextBound(
        270 + kSteps, weights_->config().context_length);
    EXPECT_EQ(bound,
              std::min<int64_t>(1024, weights_->config().context_length));
    EXPECT_THAT(graph->runner->captured_graphs(),
                ElementsAre(DecodeGraphKey{bucket, bound}));
    EXPECT_TRUE(graph->runner->graph_failures().empty());
    double worst = 0;
    for (size_t s = 0; s < steps.size(); ++s) {
      const LogitsComparison cmp =
          CompareLogits(steps[s].eager, steps[s].graph, n, vocab);
      worst = std::max(worst, cmp.max_abs_diff);
      if (n == bucket) {
        EXPECT_EQ(steps[s].graph, steps[s].eager) << "step " << s;
      }
      EXPECT_LT(cmp.max_abs_diff, 0.5) << "step " << s;
      EXPECT_LT(cmp.mean_kl, 1e-3) << "step " << s;
      for (const auto& [row, margin] : cmp.mismatches) {
        EXPECT_LT(margin, 0.05) << "step " << s << " row " << row;
      }
    }
    std::printf(
        "BATON_KERNEL_ERROR op=decode_graph_vs_eager case=batch_%lld "
        "max_abs=%.6g atol=0.5 rtol=0\n",
        static_cast<long long>(n), worst);
    ExpectUntouchedBlocksAreZero(*graph->runner);
    FreeTables(*graph, *eager);
  }
}

// Five short sequences (bucket 8, tier 256) for 8 steps: one capture after
// the first step, then 7 replays with growing contexts (crossing into new
// blocks); each step's top-1 equals the eager runner's.
TEST_F(DecodeGraphRunnerTest, OneBucketIsCapturedOnceAndReplayed) {
  BATON_SKIP_WITHOUT_CUDA();
  const std::vector<int32_t> text = tokenizer_->Encode(kTeacherText);
  const int64_t vocab = weights_->config().vocab_size;
  constexpr int64_t kSteps = 8;
  auto graph = MakeGpuForward(weights_, kBlocks, 512, 64, true);
  auto eager = MakeGpuForward(weights_, kBlocks, 512, 64, false);
  ASSERT_NE(graph, nullptr);
  ASSERT_NE(eager, nullptr);
  std::vector<StepLogits> steps;
  Lockstep(*graph, *eager, Prompts(text, 5, 14), kSteps, &steps);
  if (HasFatalFailure()) return;
  EXPECT_THAT(graph->runner->captured_graphs(),
              ElementsAre(DecodeGraphKey{8, 256}));
  EXPECT_EQ(graph->runner->graph_launches(), kSteps - 1);
  for (size_t s = 0; s < steps.size(); ++s) {
    const LogitsComparison cmp =
        CompareLogits(steps[s].eager, steps[s].graph, 5, vocab);
    EXPECT_LT(cmp.max_abs_diff, 0.5) << "step " << s;
    for (const auto& [row, margin] : cmp.mismatches) {
      EXPECT_LT(margin, 0.05) << "step " << s << " row " << row;
    }
  }
  ExpectUntouchedBlocksAreZero(*graph->runner);
  FreeTables(*graph, *eager);
}

// cuda_graphs = false, set_cuda_graphs(false) and steps that do not qualify
// (a layer callback, LogitsMode::kAll, more items than max_graph_batch) run
// eagerly and give the same logits as before.
TEST_F(DecodeGraphRunnerTest, GraphsOffAndIneligibleStepsRunEagerly) {
  BATON_SKIP_WITHOUT_CUDA();
  auto off = MakeGpuForward(weights_, kBlocks, 512, 64, false);
  ASSERT_NE(off, nullptr);
  EXPECT_EQ(off->runner->max_graph_batch(), 0);
  auto on = MakeGpuForward(weights_, kBlocks, 512, 64, true, 2);
  ASSERT_NE(on, nullptr);
  EXPECT_EQ(on->runner->max_graph_batch(), 2);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  for (GpuForward* g : {off.get(), on.get()}) {
    std::vector<BlockTable> tables(3);
    std::vector<float> logits;
    for (BlockTable& t : tables) {
      ASSERT_TRUE(g->allocator->Reserve(t, 16).ok());
      const ForwardItem item{&t, 0, prompt, LogitsMode::kLast};
      ASSERT_TRUE(g->runner->Forward({&item, 1}, &logits).ok());
    }
    const int32_t token = 7;
    auto decode = [&](int64_t n, LogitsMode mode, const LayerDoneFn& done) {
      std::vector<ForwardItem> items;
      for (int64_t i = 0; i < n; ++i) {
        items.push_back({&tables[i], tables[i].num_tokens(),
                         std::span<const int32_t>(&token, 1), mode});
      }
      return g->runner->Forward(items, &logits, done);
    };
    int64_t layers = 0;
    ASSERT_TRUE(decode(1, LogitsMode::kLast, [&](int64_t) { ++layers; }).ok());
    EXPECT_EQ(layers, weights_->config().num_layers);
    ASSERT_TRUE(decode(1, LogitsMode::kAll, nullptr).ok());
    ASSERT_TRUE(decode(3, LogitsMode::kLast, nullptr).ok());
    EXPECT_EQ(g->runner->graph_launches(), 0);
    EXPECT_EQ(g->runner->eager_steps(), 6);
    EXPECT_TRUE(g->runner->captured_graphs().empty());
    if (g == on.get()) {
      // First step of key {2, 256}: padded, eager, then captured.
      ASSERT_TRUE(decode(2, LogitsMode::kLast, nullptr).ok());
      EXPECT_EQ(g->runner->eager_steps(), 7);
      EXPECT_THAT(g->runner->captured_graphs(),
                  ElementsAre(DecodeGraphKey{2, 256}));
      ASSERT_TRUE(decode(2, LogitsMode::kLast, nullptr).ok());
      EXPECT_EQ(g->runner->graph_launches(), 1);
      g->runner->set_cuda_graphs(false);
      ASSERT_TRUE(decode(2, LogitsMode::kLast, nullptr).ok());
      EXPECT_EQ(g->runner->graph_launches(), 1);
      EXPECT_EQ(g->runner->eager_steps(), 8);
      g->runner->set_cuda_graphs(true);
      ASSERT_TRUE(decode(2, LogitsMode::kLast, nullptr).ok());
      EXPECT_EQ(g->runner->graph_launches(), 2);
      EXPECT_TRUE(g->runner->graph_failures().empty());
    }
    EXPECT_TRUE(g->runner->healthy());
    for (BlockTable& t : tables) g->allocator->Free(t);
  }
}

// A pool far beyond device memory is ResourceExhausted naming the bytes.
TEST_F(DecodeGraphRunnerTest, CreateWithAHugePoolIsResourceExhausted) {
  BATON_SKIP_WITHOUT_CUDA();
  KvLayout layout;
  const ModelConfig& c = weights_->config();
  layout.num_layers = c.num_layers;
  layout.num_kv_heads = c.num_kv_heads;
  layout.head_dim = c.head_dim;
  layout.block_size = 16;
  layout.dtype = DType::kF16;
  const int64_t blocks = (int64_t{1} << 31) - 1;  // ~790 TB for this model
  auto runner = CudaModelRunner::Create(weights_, layout, blocks, {});
  ASSERT_FALSE(runner.ok());
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kResourceExhausted)
      << runner.status();
  const uint64_t bytes =
      static_cast<uint64_t>(c.num_layers) * blocks * layout.chunk_bytes();
  EXPECT_THAT(runner.status().message(), HasSubstr(std::to_string(bytes)));
  EXPECT_THAT(runner.status().message(), HasSubstr("KV pool"));
}

// The decode kernel as the graphs use it: a padding row (context 0, empty
// table) comes out as zeros, and a real row's bits do not depend on a fixed
// max_context_len far above its context (8192: 32 split CTAs, most empty)
// nor on the padding beside it.
TEST(DecodeGraphKernelTest, PaddingRowIsZeroAndTheBoundDoesNotChangeBits) {
  BATON_SKIP_WITHOUT_CUDA();
  constexpr int64_t kHeads = 9, kKvHeads = 3, kDim = 64, kBlock = 16;
  constexpr int64_t kPoolBlocks = 40;
  constexpr int32_t kContext = 600;  // 3 splits of its own
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  std::vector<uint16_t> pool(kPoolBlocks * 2 * kKvHeads * kBlock * kDim);
  for (uint16_t& h : pool) h = F32ToF16(uniform(rng));
  cuda_test::DeviceBuffer<uint16_t> dev_pool(pool);
  cuda::PagedKvPoolView kv;
  kv.pool = dev_pool.get();
  kv.num_blocks = kPoolBlocks;
  kv.num_kv_heads = kKvHeads;
  kv.head_dim = kDim;
  kv.block_size = kBlock;
  std::vector<int32_t> ids((kContext + kBlock - 1) / kBlock);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int32_t>((7 * i + 3) % kPoolBlocks);
  }
  const int32_t nb = static_cast<int32_t>(ids.size());
  std::vector<float> q(2 * kHeads * kDim);
  for (float& x : q) x = uniform(rng);
  // Runs rows {real, padding} (or the real row alone) with `bound`.
  auto run = [&](bool padded, int32_t bound) {
    const int32_t seqs = padded ? 2 : 1;
    const std::vector<int32_t> ctx = {kContext, 0};
    const std::vector<int32_t> offsets = {0, nb, nb};
    cuda_test::DeviceBuffer<int32_t> d_ctx{
        std::span<const int32_t>(ctx).first(seqs)};
    cuda_test::DeviceBuffer<int32_t> d_off{
        std::span<const int32_t>(offsets).first(seqs + 1)};
    cuda_test::DeviceBuffer<int32_t> d_ids(ids);
    cuda_test::DeviceBuffer<float> d_q{
        std::span<const float>(q).first(seqs * kHeads * kDim)};
    cuda_test::DeviceBuffer<float> d_out(seqs * kHeads * kDim);
    d_out.Poison();
    const size_t ws_bytes =
        cuda::PagedDecodeWorkspaceBytes(seqs, kHeads, kDim, bound);
    cuda_test::DeviceBuffer<uint8_t> ws(ws_bytes);
    cuda::PagedDecodeBatch batch;
    batch.num_seqs = seqs;
    batch.max_context_len = bound;
    batch.context_lens = d_ctx.get();
    batch.tables = {d_ids.get(), d_off.get()};
    EXPECT_EQ(
        cuda::PagedAttentionDecode(d_q.get(), batch, kv, kHeads, 0.125f,
                                   ws.get(), ws_bytes, d_out.get(), nullptr),
        cudaSuccess);
    return d_out.Download();
  };
  const std::vector<float> alone = run(false, kContext);
  const std::vector<float> fixed = run(true, 8192);
  ASSERT_EQ(fixed.size(), 2 * alone.size());
  for (size_t i = 0; i < alone.size(); ++i) {
    ASSERT_TRUE(std::isfinite(alone[i])) << "element " << i;
    ASSERT_EQ(fixed[i], alone[i]) << "element " << i;
  }
  for (size_t i = alone.size(); i < fixed.size(); ++i) {
    ASSERT_EQ(fixed[i], 0.f) << "padding element " << i - alone.size();
  }
  std::printf(
      "BATON_KERNEL_ERROR op=decode_graph_padding case=ctx600_bound8192 "
      "max_abs=0 atol=0 rtol=0\n");
}

}  // namespace
}  // namespace baton
