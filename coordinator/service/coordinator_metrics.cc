#include "coordinator/service/coordinator_metrics.h"

#include "absl/strings/ascii.h"
#include "common/metrics/metrics.h"

namespace baton::coordinator {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

const prometheus::Labels& RoleLabel() {
  static const auto* labels = new prometheus::Labels{{"role", "coordinator"}};
  return *labels;
}

prometheus::Histogram& AddHistogram(prometheus::Registry& registry,
                                    const std::string& name,
                                    const std::string& help,
                                    const std::vector<double>& buckets) {
  return BuildHistogram().Name(name).Help(help).Register(registry).Add(
      RoleLabel(), buckets);
}

prometheus::Gauge& HealthyGauge(prometheus::Family<prometheus::Gauge>& family,
                                WorkerRole role) {
  return family.Add({{"role", "coordinator"},
                     {"worker_role", std::string(WorkerRoleName(role))}});
}

}  // namespace

std::string RequestStatusLabel(const absl::Status& status,
                               v1::FinishReason reason) {
  if (!status.ok()) return metrics::StatusCodeLabel(status.code());
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_CANCELLED:
      return "cancelled";
    default:
      return absl::AsciiStrToLower(v1::FinishReason_Name(reason));
  }
}

CoordinatorMetrics::CoordinatorMetrics(prometheus::Registry& registry)
    : requests_(BuildCounter()
                    .Name("baton_requests_total")
                    .Help("Generate requests that ended, by status: the "
                          "finish reason (stop, length, cancelled) or the "
                          "error code (e.g. unavailable)")
                    .Register(registry)),
      requests_stop_(RequestCounter("stop")),
      requests_length_(RequestCounter("length")),
      requests_cancelled_(RequestCounter("cancelled")),
      active_(BuildGauge()
                  .Name("baton_requests_active")
                  .Help("Generate requests running now")
                  .Register(registry)
                  .Add(RoleLabel())),
      prompt_tokens_(BuildCounter()
                         .Name("baton_prompt_tokens_total")
                         .Help("Prompt tokens of requests whose prefill "
                               "finished")
                         .Register(registry)
                         .Add(RoleLabel())),
      generation_tokens_(BuildCounter()
                             .Name("baton_generation_tokens_total")
                             .Help("Generated tokens streamed to clients")
                             .Register(registry)
                             .Add(RoleLabel())),
      queue_time_(AddHistogram(
          registry, "baton_request_queue_time_seconds",
          "Time from a request's arrival to the start of its prefill",
          metrics::RequestLatencyBuckets())),
      ttft_(AddHistogram(registry, "baton_time_to_first_token_seconds",
                         "Time from a request's arrival to its first token "
                         "reaching the client",
                         metrics::RequestLatencyBuckets())),
      tpot_(AddHistogram(
          registry, "baton_time_per_output_token_seconds",
          "Per request: time from the first to the last token over the "
          "tokens after the first (requests with two tokens or more)",
          metrics::TokenLatencyBuckets())),
      inter_token_(AddHistogram(
          registry, "baton_inter_token_latency_seconds",
          "Time between consecutive tokens streamed to a client (a message "
          "of k tokens counts k gaps of a k-th of its delay)",
          metrics::TokenLatencyBuckets())),
      e2e_(AddHistogram(registry, "baton_e2e_request_latency_seconds",
                        "Time from a request's arrival to its end (result "
                        "or error), whatever the outcome",
                        metrics::RequestLatencyBuckets())),
      migrations_(BuildCounter()
                      .Name("baton_migrations_total")
                      .Help("Times a streaming request moved to another "
                            "decode worker after a fault, continuing from "
                            "the tokens already streamed")
                      .Register(registry)
                      .Add(RoleLabel())),
      retries_(BuildCounter()
                   .Name("baton_retries_total")
                   .Help("Times a request started over on other workers "
                         "after a fault, before its first token")
                   .Register(registry)
                   .Add(RoleLabel())),
      local_prefills_(
          BuildCounter()
              .Name("baton_local_prefills_total")
              .Help("Requests of split serving prefilled on the decode worker "
                    "whose prefix cache held all but a few of their prompt "
                    "tokens (--local_prefill_tokens): no KV transfer")
              .Register(registry)
              .Add(RoleLabel())),
      shed_(BuildCounter()
                .Name("baton_requests_shed_total")
                .Help("Requests refused on arrival with RESOURCE_EXHAUSTED "
                      "(HTTP 429), by the limit that refused them: "
                      "queue_full or ttft_slo")
                .Register(registry)),
      waiting_(BuildGauge()
                   .Name("baton_requests_waiting")
                   .Help("Admitted requests that have not reached their "
                         "first token")
                   .Register(registry)
                   .Add(RoleLabel())),
      healthy_(BuildGauge()
                   .Name("baton_workers_healthy")
                   .Help("Registered workers in the HEALTHY state, by role")
                   .Register(registry)),
      healthy_prefill_(HealthyGauge(healthy_, WorkerRole::kPrefill)),
      healthy_decode_(HealthyGauge(healthy_, WorkerRole::kDecode)),
      healthy_both_(HealthyGauge(healthy_, WorkerRole::kBoth)) {
  // Exported at 0 from the start, so a dashboard's series exist before
  // the first refusal.
  for (absl::string_view reason : {"queue_full", "ttft_slo"}) {
    shed_.Add({{"role", "coordinator"}, {"reason", std::string(reason)}});
  }
}

prometheus::Counter& CoordinatorMetrics::RequestCounter(
    absl::string_view status) {
  return requests_.Add(
      {{"role", "coordinator"}, {"status", std::string(status)}});
}

void CoordinatorMetrics::OnRequestStarted() { active_.Increment(); }

void CoordinatorMetrics::OnRequestShed(absl::string_view reason,
                                       const absl::Status& status) {
  shed_.Add({{"role", "coordinator"}, {"reason", std::string(reason)}})
      .Increment();
  OnRequestRejected(status);
}

void CoordinatorMetrics::OnRequestRejected(const absl::Status& status) {
  RequestCounter(RequestStatusLabel(status, v1::FINISH_REASON_UNSPECIFIED))
      .Increment();
}

void CoordinatorMetrics::OnFirstToken(double ttft_s, int64_t prompt_tokens) {
  ttft_.Observe(ttft_s);
  prompt_tokens_.Increment(static_cast<double>(prompt_tokens));
}

metrics::HistogramAccumulator CoordinatorMetrics::NewInterTokenAccumulator()
    const {
  return metrics::HistogramAccumulator(&metrics::TokenLatencyBuckets());
}

void CoordinatorMetrics::OnRequestFinished(
    const FinishedRequest& request,
    metrics::HistogramAccumulator* inter_token) {
  if (request.status == "stop") {
    requests_stop_.Increment();
  } else if (request.status == "length") {
    requests_length_.Increment();
  } else if (request.status == "cancelled") {
    requests_cancelled_.Increment();
  } else {
    RequestCounter(request.status).Increment();
  }
  active_.Decrement();
  e2e_.Observe(request.e2e_s);
  if (request.queue_s >= 0) queue_time_.Observe(request.queue_s);
  if (request.completion_tokens > 1) {
    tpot_.Observe(request.first_to_last_token_s /
                  static_cast<double>(request.completion_tokens - 1));
  }
  if (inter_token != nullptr) inter_token->FlushTo(inter_token_);
}

void CoordinatorMetrics::SetWorkers(const std::vector<WorkerInfo>& workers) {
  int64_t prefill = 0;
  int64_t decode = 0;
  int64_t both = 0;
  for (const WorkerInfo& w : workers) {
    if (w.health != WorkerHealth::kHealthy) continue;
    switch (w.registration.role) {
      case WorkerRole::kPrefill:
        ++prefill;
        break;
      case WorkerRole::kDecode:
        ++decode;
        break;
      case WorkerRole::kBoth:
        ++both;
        break;
    }
  }
  healthy_prefill_.Set(static_cast<double>(prefill));
  healthy_decode_.Set(static_cast<double>(decode));
  healthy_both_.Set(static_cast<double>(both));
}

}  // namespace baton::coordinator
