// Helpers shared by kv_transfer_bench's parts: timing, medians, flag lists,
// fail-fast status checks, the model shapes and their KV pools.
#ifndef BATON_BENCH_KV_BENCH_UTIL_H_
#define BATON_BENCH_KV_BENCH_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/kv_cache/kv_cache.h"

namespace baton::kvbench {

// Seconds on a monotonic clock.
double Now();

// Median of v (mean of the middle two for an even count); 0 when empty.
double Median(std::vector<double> v);

// "1,2,3" -> {1, 2, 3}; skips empty and negative or malformed entries.
std::vector<int64_t> ParseList(const std::string& s);

// Prints "kv_transfer_bench: what: status" and exits with 1.
[[noreturn]] void Die(const std::string& what, const absl::Status& s);

template <typename T>
T Must(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Die(what, v.status());
  return std::move(*v);
}

inline void Must(const absl::Status& s, const std::string& what) {
  if (!s.ok()) Die(what, s);
}

// A model's KV shape.
struct Shape {
  std::string name;
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  std::string model_path;  // for the overlap runs
};

// A prefaulted F16 pool of `num_blocks` blocks of 16 tokens at `shape`.
std::unique_ptr<KvCache> MakeCache(const Shape& shape, int64_t num_blocks);

// Writes every byte of the pool (as a long-running worker's pool is), so no
// timed copy pays first-touch page faults.
void TouchPool(KvCache& cache);

}  // namespace baton::kvbench

#endif  // BATON_BENCH_KV_BENCH_UTIL_H_
