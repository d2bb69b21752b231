// The coordinator's Prometheus metrics (label role="coordinator"): request
// outcomes, latencies of the token stream, token counts, active requests and
// healthy workers. Recording is lock-free except where noted (histogram
// observations take prometheus-cpp's per-histogram mutex, once per request).
//
//   baton_requests_total{status}            counter; status: stop, length,
//                                           cancelled, or an error code
//                                           (invalid_argument, unavailable,
//                                           deadline_exceeded, ...)
//   baton_requests_active                   gauge
//   baton_prompt_tokens_total               counter (prompts prefilled)
//   baton_generation_tokens_total           counter (tokens streamed)
//   baton_request_queue_time_seconds        histogram, arrival to prefill
//   baton_time_to_first_token_seconds       histogram
//   baton_time_per_output_token_seconds     histogram, per request
//   baton_inter_token_latency_seconds       histogram, per token
//   baton_e2e_request_latency_seconds       histogram, arrival to the end
//   baton_workers_healthy{worker_role}      gauge, per worker role
//   baton_migrations_total                  counter, requests moved to
//                                           another decode worker mid-stream
//   baton_retries_total                     counter, requests started over
//                                           before their first token
//   baton_local_prefills_total              counter, split-served requests
//                                           prefilled on the decode worker
//                                           that held their prefix
//   baton_requests_shed_total{reason}       counter, refused on arrival
//                                           (queue_full, ttft_slo)
//   baton_requests_waiting                  gauge, admitted and before
//                                           their first token
#ifndef BATON_COORDINATOR_SERVICE_COORDINATOR_METRICS_H_
#define BATON_COORDINATOR_SERVICE_COORDINATOR_METRICS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "baton/v1/types.pb.h"
#include "common/metrics/histogram_accumulator.h"
#include "coordinator/worker_registry.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace baton::coordinator {

// How one Generate request ended, as CoordinatorMetrics records it.
struct FinishedRequest {
  // The `status` label: RequestStatusLabel(...).
  std::string status;
  // Arrival to the end (result or error sent).
  double e2e_s = 0;
  // Arrival to the start of its (last) prefill; < 0: it never started.
  double queue_s = -1;
  // Tokens streamed to the client, and the time from the first to the last.
  int64_t completion_tokens = 0;
  double first_to_last_token_s = 0;
};

// The `status` label of a request that ended with `status`: the finish
// reason of a finished request (`status` OK: "stop", "length", "cancelled"),
// else the error's code ("cancelled", "unavailable", ...).
std::string RequestStatusLabel(const absl::Status& status,
                               v1::FinishReason reason);

class CoordinatorMetrics {
 public:
  // Registers (or finds, if already registered) the coordinator's metrics
  // in `registry`, which must outlive this object.
  explicit CoordinatorMetrics(prometheus::Registry& registry);
  CoordinatorMetrics(const CoordinatorMetrics&) = delete;
  CoordinatorMetrics& operator=(const CoordinatorMetrics&) = delete;

  // A request passed validation and runs; OnRequestFinished follows.
  void OnRequestStarted();
  // A request refused before it ran (bad arguments, shutting down): counted
  // in baton_requests_total only.
  void OnRequestRejected(const absl::Status& status);
  // A request refused at admission by the limit `reason` (queue_full,
  // ttft_slo) with `status`; also counted in baton_requests_total.
  void OnRequestShed(absl::string_view reason, const absl::Status& status);
  // Admitted requests before their first token.
  void SetWaiting(int64_t waiting) {
    waiting_.Set(static_cast<double>(waiting));
  }
  // The first token reached the client `ttft_s` after arrival; the prompt
  // (`prompt_tokens`) has been prefilled.
  void OnFirstToken(double ttft_s, int64_t prompt_tokens);
  // `tokens` more tokens were streamed (the first token included).
  void OnTokens(int64_t tokens) {
    generation_tokens_.Increment(static_cast<double>(tokens));
  }
  // A streaming request moves to another decode worker after a fault.
  void OnMigration() { migrations_.Increment(); }
  // A request starts over before its first token after a fault.
  void OnRetry() { retries_.Increment(); }
  // A request goes to the decode worker that holds its prompt but for a
  // few tokens, which prefills them itself (local_prefill_tokens).
  void OnLocalPrefill() { local_prefills_.Increment(); }
  // Gaps between the tokens of one request, kept by its call and handed
  // over in OnRequestFinished.
  metrics::HistogramAccumulator NewInterTokenAccumulator() const;
  // The request ended (once per OnRequestStarted). Flushes `inter_token`.
  void OnRequestFinished(const FinishedRequest& request,
                         metrics::HistogramAccumulator* inter_token);

  // Sets baton_workers_healthy from the registry's current view.
  void SetWorkers(const std::vector<WorkerInfo>& workers);

 private:
  prometheus::Counter& RequestCounter(absl::string_view status);

  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Counter& requests_stop_;
  prometheus::Counter& requests_length_;
  prometheus::Counter& requests_cancelled_;
  prometheus::Gauge& active_;
  prometheus::Counter& prompt_tokens_;
  prometheus::Counter& generation_tokens_;
  prometheus::Histogram& queue_time_;
  prometheus::Histogram& ttft_;
  prometheus::Histogram& tpot_;
  prometheus::Histogram& inter_token_;
  prometheus::Histogram& e2e_;
  prometheus::Counter& migrations_;
  prometheus::Counter& retries_;
  prometheus::Counter& local_prefills_;
  prometheus::Family<prometheus::Counter>& shed_;
  prometheus::Gauge& waiting_;
  prometheus::Family<prometheus::Gauge>& healthy_;
  prometheus::Gauge& healthy_prefill_;
  prometheus::Gauge& healthy_decode_;
  prometheus::Gauge& healthy_both_;
};

}  // namespace baton::coordinator

#endif  // BATON_COORDINATOR_SERVICE_COORDINATOR_METRICS_H_
