// A simulated workload: Poisson or gamma arrivals with lengths uniform
// around their means (as baton-bench's random dataset), or a CSV trace:
// either `timestamp_s,input_len,output_len` (seconds from the start), or
// Azure's LLM inference trace columns `TIMESTAMP,ContextTokens,
// GeneratedTokens` (TIMESTAMP as "2023-11-16 18:15:46.6805900"; times are
// taken relative to the first); or Mooncake's JSON lines, one request per
// line: {"timestamp": ms, "input_length": n, "output_length": n,
// "hash_ids": [...]}, each hash id naming a 512-token piece of the prompt
// (chained: equal ids, equal prefixes), which the simulator maps onto its
// block_size-token blocks (prefix_model.h).
#ifndef BATON_BENCH_SIM_WORKLOAD_H_
#define BATON_BENCH_SIM_WORKLOAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/sim/simulator.h"

namespace baton::sim {

struct WorkloadOptions {
  std::string trace;  // non-empty: read it, ignore the rest
  int num_prompts = 1000;
  double request_rate = 1.0;
  double burstiness = 1.0;
  int32_t input_len = 1024;
  int32_t output_len = 128;
  double range_ratio = 0.0;  // in [0, 1)
  uint64_t seed = 0;
};

absl::StatusOr<std::vector<SimRequest>> ReadTrace(const std::string& path);
absl::StatusOr<std::vector<SimRequest>> MakeWorkload(const WorkloadOptions& o);

}  // namespace baton::sim

#endif  // BATON_BENCH_SIM_WORKLOAD_H_
