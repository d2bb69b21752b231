// A worker's cost model, as baton-sim and the simulated engine
// (baton-worker --engine=simulated) read it from a small JSON file: how
// long a prefill, a decode step and a KV transfer take on some hardware.
//
//   {
//     "name": "SmolLM2-135M Q4_1, 1 thread, AMD EPYC (avx512vnni)",
//     "source": "measured with ... on 2026-12-04",
//     "prefill": {"c0": 0.002, "c1": 0.0011, "c2": 1e-7},
//     "decode": {"c0": 0.004, "c1": 2e-6, "c2": 0.0005},
//     "transfer": {"alpha_s": 0.0005, "bytes_per_s": 1.5e9},
//     "kv_bytes_per_token": 23040,
//     "kv_blocks": 4096, "block_size": 16,
//     "max_batch_tokens": 512, "max_num_seqs": 64,
//     "neighbor_slowdown": {"prefill": 0.05, "decode": 0.2}
//   }
//
// Prefill of a batch of prompts with lengths l_i takes
// c0 + c1·Σl + c2·Σl² seconds (the square is attention's); a decode step of
// B sequences with contexts ctx_i takes c0 + c1·Σctx + c2·B; a KV transfer
// of b bytes alpha_s + b / bytes_per_s. Every coefficient is >= 0, so each
// time grows with its arguments.
#ifndef BATON_WORKER_ENGINE_COST_PROFILE_H_
#define BATON_WORKER_ENGINE_COST_PROFILE_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace baton {

struct CostModel {
  double c0 = 0;
  double c1 = 0;
  double c2 = 0;
};

struct WorkerProfile {
  std::string name;
  // Where the figures come from (a measurement and its command, or the
  // published figures they were derived from).
  std::string source;
  CostModel prefill;
  CostModel decode;
  // A transfer of t tokens takes alpha + t * kv_bytes_per_token / bytes_per_s
  // + s_per_token2 * t^2 seconds from the prefill's start. The square term
  // is 0 for a link-bound transfer; one that streams layer by layer as a CPU
  // prefill computes goes at the prefill's pace, whose attention grows with
  // the square of the prompt.
  double transfer_alpha_s = 0;
  double transfer_bytes_per_s = 1e9;
  double transfer_s_per_token2 = 0;
  int64_t kv_bytes_per_token = 0;
  // KV pool of one worker, in blocks of block_size tokens.
  int64_t kv_blocks = 4096;
  int64_t block_size = 16;
  // Tokens one engine step feeds: prompt chunks and one per decode
  // (SchedulerOptions::max_num_batched_tokens).
  int64_t max_batch_tokens = 512;
  // Sequences admitted at once from the waiting prompts
  // (SchedulerOptions::max_num_seqs; a decode worker's landed requests
  // join beyond it).
  int64_t max_num_seqs = 64;
  // How much slower a step's prefill and its decode run while another
  // worker of the same host computes (shared cores, caches and memory
  // bandwidth), as fractions: 0.05 is 5% slower per busy neighbour. The
  // two differ (a memory-bound decode step suffers more beside a prefill
  // than the other way round). In JSON one number for both or
  // {"prefill": P, "decode": D}. Optional, 0 by default (one worker per
  // host, or devices that share nothing); baton-sim applies it with
  // --workers_per_host, the simulated engine does not.
  struct NeighborSlowdown {
    double prefill = 0;
    double decode = 0;
  };
  NeighborSlowdown neighbor_slowdown;
  // The decode fit's error by batch, measured on its own samples: a step
  // of batch B costs the fit times the factor at B, interpolated linearly
  // between the batches listed (ascending) and the end's beyond them. A
  // one-thread CPU worker's step grows less than linearly from one request
  // to a few and more beyond them (caches, then memory), which c2·B cannot
  // follow (docs/planning.md, "Cost profiles"). In JSON [[B, factor], ...];
  // optional, none by default (factor 1).
  struct BatchFactor {
    int64_t batch = 1;
    double factor = 1;
  };
  std::vector<BatchFactor> decode_batch_factors;
};

// INVALID_ARGUMENT naming the field for a missing or out-of-range value
// (negative coefficients, a non-positive bandwidth, block size or limit).
absl::StatusOr<WorkerProfile> ParseProfile(const nlohmann::json& json);
absl::StatusOr<WorkerProfile> LoadProfile(const std::string& path);
nlohmann::json ProfileJson(const WorkerProfile& profile);

double PrefillSeconds(const WorkerProfile& p, std::span<const int64_t> lengths);
// A prompt piece computed on top of `start` tokens already in the cache (a
// prefix-cache hit, an earlier chunk): its tokens cost c1 each and attend
// to everything before them, c2·((start + tokens)² - start²).
struct PrefillPiece {
  int64_t start = 0;
  int64_t tokens = 0;
};
double PrefillSeconds(const WorkerProfile& p,
                      std::span<const PrefillPiece> pieces);
// The decode fit times its factor at `batch` (decode_batch_factors).
double DecodeSeconds(const WorkerProfile& p, int64_t sum_context,
                     int64_t batch);
double DecodeBatchFactor(const WorkerProfile& p, int64_t batch);
double TransferSeconds(const WorkerProfile& p, int64_t tokens);

// One engine step as the cost model prices it, built item by item: the
// simulated engine (its forward pass) and baton-sim (its steps) both price
// a step through it, so the two agree on what each part of a batch costs.
class StepWork {
 public:
  // A sequence fed `tokens` tokens on top of the `start` its cache holds.
  // One token after the first is a decode (memory-bound, what the decode
  // fit measures), a prompt's last chunk of one token included; anything
  // else is a prompt piece.
  void Add(int64_t start, int64_t tokens) {
    if (tokens == 1 && start > 0) {
      ++decode_batch_;
      decode_context_ += start + 1;
    } else {
      prompts_.push_back({start, tokens});
    }
  }
  // Seconds of the step's prompt pieces and of its decode batch (0 for a
  // part it lacks): SharedHosts slows each down by its own fraction.
  double PrefillPart(const WorkerProfile& p) const {
    return prompts_.empty() ? 0 : PrefillSeconds(p, prompts_);
  }
  double DecodePart(const WorkerProfile& p) const {
    return decode_batch_ == 0
               ? 0
               : DecodeSeconds(p, decode_context_, decode_batch_);
  }
  bool empty() const { return prompts_.empty() && decode_batch_ == 0; }

 private:
  std::vector<PrefillPiece> prompts_;
  int64_t decode_batch_ = 0;
  int64_t decode_context_ = 0;  // Σ tokens each decode attends to
};

}  // namespace baton

#endif  // BATON_WORKER_ENGINE_COST_PROFILE_H_
