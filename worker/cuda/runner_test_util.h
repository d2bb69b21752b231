// What the CUDA runner tests share: the CPU and GPU runners behind one
// forward function and greedy generation with chunked prefill and batched
// decode (the fixed text and the logits comparison: logits_test_util.h).
#ifndef BATON_WORKER_CUDA_RUNNER_TEST_UTIL_H_
#define BATON_WORKER_CUDA_RUNNER_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cpu/thread_pool.h"
#include "worker/cuda/cuda_model_runner.h"
#include "worker/engine/logits_test_util.h"
#include "worker/engine/model_runner.h"
#include "worker/kv_cache/kv_cache.h"

namespace baton {

// A host KvCache shaped for the model (block size 16, F16), whose block ids
// the device pool mirrors. Null (with a test failure) on error.
inline std::unique_ptr<KvCache> MakeAllocator(const ModelWeights& weights,
                                              int64_t num_blocks) {
  const ModelConfig& c = weights.config();
  KvCacheOptions options;
  options.num_layers = c.num_layers;
  options.num_kv_heads = c.num_kv_heads;
  options.head_dim = c.head_dim;
  options.block_size = 16;
  options.num_blocks = num_blocks;
  auto cache = KvCache::Create(options);
  if (!cache.ok()) {
    ADD_FAILURE() << cache.status();
    return nullptr;
  }
  return std::move(*cache);
}

using ForwardFn = std::function<absl::Status(std::span<const ForwardItem>,
                                             std::vector<float>*)>;

struct CpuForward {
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<ModelRunner> runner;
  ForwardFn Fn() {
    return [this](std::span<const ForwardItem> items, std::vector<float>* l) {
      return runner->Forward(items, l);
    };
  }
};

inline std::unique_ptr<CpuForward> MakeCpuForward(const ModelWeights* weights,
                                                  int64_t num_blocks) {
  auto f = std::make_unique<CpuForward>();
  ThreadPoolOptions pool_options;
  pool_options.num_threads = static_cast<int>(
      std::clamp(std::thread::hardware_concurrency(), 1u, 64u));
  auto pool = ThreadPool::Create(pool_options);
  if (!pool.ok()) {
    ADD_FAILURE() << pool.status();
    return nullptr;
  }
  f->pool = std::move(*pool);
  f->cache = MakeAllocator(*weights, num_blocks);
  if (f->cache == nullptr) return nullptr;
  auto runner = ModelRunner::Create(weights, f->cache.get(), f->pool.get());
  if (!runner.ok()) {
    ADD_FAILURE() << runner.status();
    return nullptr;
  }
  f->runner = std::move(*runner);
  return f;
}

struct GpuForward {
  std::unique_ptr<KvCache> allocator;  // host bookkeeping of the block ids
  std::unique_ptr<CudaModelRunner> runner;
  ForwardFn Fn() {
    return [this](std::span<const ForwardItem> items, std::vector<float>* l) {
      return runner->Forward(items, l);
    };
  }
};

// `cuda_graphs` and `max_graph_batch` as CudaRunnerOptions.
inline std::unique_ptr<GpuForward> MakeGpuForward(
    const ModelWeights* weights, int64_t num_blocks, int64_t max_batch_tokens,
    int64_t max_logits_rows, bool cuda_graphs = true,
    int64_t max_graph_batch = 64) {
  auto f = std::make_unique<GpuForward>();
  f->allocator = MakeAllocator(*weights, num_blocks);
  if (f->allocator == nullptr) return nullptr;
  CudaRunnerOptions options;
  options.allocator = f->allocator.get();
  options.max_batch_tokens = max_batch_tokens;
  options.max_logits_rows = max_logits_rows;
  options.cuda_graphs = cuda_graphs;
  options.max_graph_batch = max_graph_batch;
  auto runner = CudaModelRunner::Create(weights, f->allocator->layout(),
                                        num_blocks, options);
  if (!runner.ok()) {
    ADD_FAILURE() << runner.status();
    return nullptr;
  }
  f->runner = std::move(*runner);
  return f;
}

struct Generation {
  absl::Status status;
  std::vector<std::vector<int32_t>> tokens;             // [prompt][step]
  std::vector<std::vector<std::vector<float>>> logits;  // [prompt][step]
};

// Greedy generation of `steps` tokens per prompt: prefill rounds hold each
// unfinished prompt's next chunk of at most `chunk` tokens, then every
// decode step holds all prompts. With `forced` ([prompt][step], e.g. another
// run's tokens), each decode step feeds the forced token instead of this
// run's own pick, so two runs' logits stay comparable row by row however
// near a tie they pass. Every table is freed before returning.
inline Generation Generate(
    KvCache& cache, const ForwardFn& forward,
    const std::vector<std::vector<int32_t>>& prompts, int64_t chunk,
    int64_t steps, int64_t vocab,
    const std::vector<std::vector<int32_t>>* forced = nullptr) {
  Generation g;
  const size_t n = prompts.size();
  g.tokens.resize(n);
  g.logits.resize(n);
  std::vector<BlockTable> tables(n);
  auto take = [&](size_t p, const float* row) {
    g.tokens[p].push_back(Argmax(row, vocab));
    g.logits[p].emplace_back(row, row + vocab);
  };
  auto run = [&](const std::vector<ForwardItem>& items,
                 const std::vector<size_t>& rows) -> absl::Status {
    std::vector<float> logits;
    absl::Status status = forward(items, &logits);
    if (!status.ok()) return status;
    if (logits.size() != rows.size() * static_cast<size_t>(vocab)) {
      return absl::InternalError("wrong number of logit rows");
    }
    for (size_t i = 0; i < rows.size(); ++i) {
      take(rows[i], logits.data() + i * vocab);
    }
    return absl::OkStatus();
  };
  for (size_t p = 0; p < n && g.status.ok(); ++p) {
    g.status = cache.Reserve(tables[p], prompts[p].size() + steps);
  }
  for (int64_t start = 0; g.status.ok(); start += chunk) {
    std::vector<ForwardItem> items;
    std::vector<size_t> rows;
    for (size_t p = 0; p < n; ++p) {
      const int64_t size = static_cast<int64_t>(prompts[p].size());
      if (start >= size) continue;
      const int64_t len = std::min(chunk, size - start);
      const bool last = start + len == size;
      items.push_back({&tables[p], start,
                       std::span<const int32_t>(prompts[p]).subspan(start, len),
                       last ? LogitsMode::kLast : LogitsMode::kNone});
      if (last) rows.push_back(p);
    }
    if (items.empty()) break;
    g.status = run(items, rows);
  }
  for (int64_t s = 1; s < steps && g.status.ok(); ++s) {
    std::vector<ForwardItem> items;
    std::vector<size_t> rows;
    for (size_t p = 0; p < n; ++p) {
      const int32_t* next =
          forced != nullptr ? &(*forced)[p][s - 1] : &g.tokens[p].back();
      items.push_back({&tables[p],
                       static_cast<int64_t>(prompts[p].size()) + s - 1,
                       std::span<const int32_t>(next, 1), LogitsMode::kLast});
      rows.push_back(p);
    }
    g.status = run(items, rows);
  }
  for (BlockTable& t : tables) cache.Free(t);
  return g;
}

}  // namespace baton

#endif  // BATON_WORKER_CUDA_RUNNER_TEST_UTIL_H_
