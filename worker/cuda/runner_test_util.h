// What the CUDA runner tests share: a fixed text, the CPU and GPU runners
// behind one forward function, greedy generation with chunked prefill and
// batched decode, and the comparison of two runs' logits.
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
#include "worker/engine/model_runner.h"
#include "worker/kv_cache/kv_cache.h"

namespace baton {

// About 200 tokens of plain English for teacher forcing.
inline constexpr char kTeacherText[] =
    "The old lighthouse stood at the end of a narrow stone pier, and for "
    "more than a century its keepers had climbed the spiral stairs every "
    "evening to light the lamp. The last keeper, a quiet woman named Ada, "
    "kept a notebook in which she wrote down the weather, the ships that "
    "passed, and the birds that rested on the railing. In winter the waves "
    "broke over the pier and the salt froze on the windows, so she scraped "
    "the glass with a wooden spoon before the light could shine through. "
    "When the harbour office finally installed an automatic lamp, Ada "
    "packed her notebooks into a wooden crate and carried them to the town "
    "library. The librarian read them for weeks. She found tides measured "
    "to the minute, storms described hour by hour, and a list of every "
    "vessel that had sought shelter in the bay. Scientists later used the "
    "notes to study how the coast had changed, and children still visit the "
    "library to read about the night a fishing boat came home guided only by "
    "the lamp and a stubborn keeper who refused to sleep.";

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

// Index of the largest value, ties to the lowest index.
inline int32_t Argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

struct Generation {
  absl::Status status;
  std::vector<std::vector<int32_t>> tokens;             // [prompt][step]
  std::vector<std::vector<std::vector<float>>> logits;  // [prompt][step]
};

// Greedy generation of `steps` tokens per prompt: prefill rounds hold each
// unfinished prompt's next chunk of at most `chunk` tokens, then every
// decode step holds all prompts. Every table is freed before returning.
inline Generation Generate(KvCache& cache, const ForwardFn& forward,
                           const std::vector<std::vector<int32_t>>& prompts,
                           int64_t chunk, int64_t steps, int64_t vocab) {
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
      items.push_back({&tables[p],
                       static_cast<int64_t>(prompts[p].size()) + s - 1,
                       std::span<const int32_t>(&g.tokens[p].back(), 1),
                       LogitsMode::kLast});
      rows.push_back(p);
    }
    g.status = run(items, rows);
  }
  for (BlockTable& t : tables) cache.Free(t);
  return g;
}

struct LogitsComparison {
  double top1_agreement = 0;  // fraction of rows with the same argmax
  double mean_kl = 0;         // mean over rows of KL(ref || got), nats
  double max_kl = 0;
  double max_abs_diff = 0;  // largest |ref - got| over all logits
  // Rows whose argmax differs, with ref[ref argmax] - ref[got argmax] (how
  // close to a tie the reference was there).
  std::vector<std::pair<int64_t, double>> mismatches;
};

// `rows` rows of `vocab` logits each; log-softmax in double.
inline LogitsComparison CompareLogits(const std::vector<float>& ref,
                                      const std::vector<float>& got,
                                      int64_t rows, int64_t vocab) {
  LogitsComparison c;
  int64_t agree = 0;
  auto log_z = [vocab](const float* row) {
    const double m = *std::max_element(row, row + vocab);
    double s = 0;
    for (int64_t i = 0; i < vocab; ++i) s += std::exp(row[i] - m);
    return m + std::log(s);
  };
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = ref.data() + r * vocab;
    const float* b = got.data() + r * vocab;
    const int32_t ta = Argmax(a, vocab), tb = Argmax(b, vocab);
    if (ta == tb) {
      ++agree;
    } else {
      c.mismatches.push_back({r, static_cast<double>(a[ta]) - a[tb]});
    }
    const double za = log_z(a), zb = log_z(b);
    double kl = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      const double la = a[i] - za, lb = b[i] - zb;
      kl += std::exp(la) * (la - lb);
      c.max_abs_diff =
          std::max(c.max_abs_diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    }
    c.mean_kl += kl / rows;
    c.max_kl = std::max(c.max_kl, kl);
  }
  c.top1_agreement = rows > 0 ? static_cast<double>(agree) / rows : 0;
  return c;
}

}  // namespace baton

#endif  // BATON_WORKER_CUDA_RUNNER_TEST_UTIL_H_
