// baton-bench's multi-turn workload (--dataset-name=multiturn): chat
// conversations whose every turn resends the whole history, as chat clients
// and agents do, so the prefix cache and prefix-aware routing are what it
// measures. Every conversation starts with the same system prompt; turn t
// is that prompt, then (user message, the answer the server gave) for each
// earlier turn, then a new user message. A conversation sends its next turn
// when the previous one finished (closed loop); max_concurrency
// conversations run at once. Token-id prompts from a seeded generator
// (same seed, same prompts), greedy sampling, ignore_eos: two runs against
// servers that compute the same tokens send the same requests.
#ifndef BATON_BENCH_SERVING_MULTITURN_H_
#define BATON_BENCH_SERVING_MULTITURN_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "baton/v1/api.grpc.pb.h"
#include "nlohmann/json.hpp"

namespace baton::bench {

struct MultiTurnOptions {
  int conversations = 32;
  int turns = 8;
  // Tokens of the shared system prompt, of each user message, and to
  // generate per turn (>= 1 each; the system prompt may be 0).
  int system_len = 512;
  int user_len = 64;
  int output_len = 64;
  // Conversations in flight at once; 0: all of them.
  int max_concurrency = 0;
  int32_t vocab_begin = 1000;
  int32_t vocab_end = 40000;
  uint64_t seed = 0;
  std::string model;
  double request_timeout_s = 600;
  const std::atomic<bool>* interrupted = nullptr;
};

// INVALID_ARGUMENT naming the flag when a field is out of range.
absl::Status ValidateMultiTurnOptions(const MultiTurnOptions& options);

struct TurnRecord {
  int conversation = 0;
  int turn = 0;  // 1-based
  bool ok = false;
  std::string error;  // when !ok
  double ttft_ms = 0;
  double e2e_ms = 0;
  int prompt_tokens = 0;
  int cached_tokens = 0;  // usage.cached_tokens
  int completion_tokens = 0;
  int64_t kv_transfer_bytes = 0;
  std::string prefill_worker;
};

struct MultiTurnRun {
  std::vector<TurnRecord> turns;
  double duration_s = 0;
  bool interrupted = false;
};

// Runs the workload on `stub` (model options.model). A failed turn ends
// its conversation (later turns would need its answer).
MultiTurnRun RunMultiTurn(v1::Baton::Stub& stub,
                          const MultiTurnOptions& options);

// The summary: TTFT median and p90 of first turns and of later turns,
// output tokens per second, cached prompt tokens and KV bytes moved per
// turn (first and later), turns failed.
nlohmann::json MultiTurnSummary(const MultiTurnRun& run);
std::string FormatMultiTurnSummary(const nlohmann::json& summary);

}  // namespace baton::bench

#endif  // BATON_BENCH_SERVING_MULTITURN_H_
