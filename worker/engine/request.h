// What a client submits to the engine and what the engine streams back.
#ifndef BATON_WORKER_ENGINE_REQUEST_H_
#define BATON_WORKER_ENGINE_REQUEST_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "worker/sampler/sampler.h"
#include "worker/sampler/sampling_params.h"

namespace baton {

using Clock = std::chrono::steady_clock;

struct GenerationRequest {
  std::string id;               // unique among live requests
  std::vector<int32_t> prompt;  // token ids, already templated
  SamplingParams params;
  // When the request reached the cluster (a coordinator's clock, µs since
  // the Unix epoch; 0: unknown, taken as its arrival at this engine).
  // Waiting prompts are admitted in this order (FcfsArrival, scheduler.h).
  int64_t arrival_unix_us = 0;
};

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
absl::string_view FinishReasonName(
    FinishReason reason);  // "stop", "length", ...

struct TokenOutput {
  int32_t token = -1;
  std::optional<float> logprob;            // when params.logprobs is set
  std::vector<TokenLogprob> top_logprobs;  // params.logprobs alternatives
  std::vector<TokenProb> processed;        // params.show_probs candidates
};

struct RequestMetrics {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  // Prompt tokens whose KV came from the prefix cache (not computed).
  int64_t cached_tokens = 0;
  Clock::time_point arrival;
  Clock::time_point first_scheduled;
  Clock::time_point first_token;
  Clock::time_point finished;
  // Seconds from arrival to the first token (time to first token).
  double ttft_s() const;
  // Generated tokens after the first, per second of decoding.
  double decode_tokens_per_s() const;
  double queue_s() const;
};

// One streamed update. Every request gets outputs until one with
// finish_reason != kNone, which is its last.
struct RequestOutput {
  std::string request_id;
  std::vector<TokenOutput> tokens;  // tokens generated since the last output
  std::string text;                 // text that became final since the last
  FinishReason finish_reason = FinishReason::kNone;
  absl::Status error;  // set when finish_reason == kError
  // Complete on the last output; cached_tokens is set on every one.
  RequestMetrics metrics;
};

using OutputCallback = std::function<void(const RequestOutput&)>;

// A prefill-only request's KV handoff, measured on the prefill side.
struct KvHandoffMetrics {
  uint64_t kv_bytes = 0;  // payload bytes handed to the sink, all layers
  // Seconds from the start of the handoff (the last chunk's step) until the
  // destination confirmed the last layer.
  double transfer_s = 0.0;
  // Seconds from the last layer's compute until the confirmation: the part
  // of the transfer that layer-wise streaming did not hide.
  double tail_s = 0.0;
};

// What a prefill-only request (Engine::SubmitPrefill) reports: first an
// event with first_token set (done == false), as soon as it is sampled; then
// exactly one event with done == true once the handoff ended and the
// request's blocks are free. A request cancelled or failed before its first
// token gets only the done event.
struct PrefillOutput {
  std::string request_id;
  std::optional<TokenOutput> first_token;
  // The sampler's effective seed: a decode engine continues the random
  // stream with params.seed set to it.
  uint64_t seed = 0;
  bool done = false;
  // On done: kNone when the destination confirmed every layer; kCancelled
  // or kError (with `error` naming the cause) otherwise.
  FinishReason finish_reason = FinishReason::kNone;
  absl::Status error;
  KvHandoffMetrics handoff;  // on done
  RequestMetrics metrics;    // on done (cached_tokens: from first_token on)
};

using PrefillCallback = std::function<void(const PrefillOutput&)>;

}  // namespace baton

#endif  // BATON_WORKER_ENGINE_REQUEST_H_
