#include "coordinator/admission.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_format.h"

namespace baton::coordinator {
namespace {

constexpr absl::string_view kQueueFull = "queue_full";
constexpr absl::string_view kTtftSlo = "ttft_slo";
constexpr absl::string_view kRunningFull = "running_full";

double Millis(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

}  // namespace

absl::Status ValidateAdmissionOptions(const AdmissionOptions& options) {
  if (options.ttft_slo < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ttft_slo must be >= 0 (0: off), got %s",
                        absl::FormatDuration(options.ttft_slo)));
  }
  if (options.max_waiting_requests < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_waiting_requests must be >= 0 (0: no bound), "
                        "got %d",
                        options.max_waiting_requests));
  }
  if (options.max_running_requests < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_running_requests must be >= 0 (0: no bound), "
                        "got %d",
                        options.max_running_requests));
  }
  return absl::OkStatus();
}

absl::Duration EstimateTtft(const WorkerInfo& worker,
                            const RequestInfo& request) {
  const double rate = worker.load.prefill_tokens_per_second;
  if (!(rate > 0) || !std::isfinite(rate)) return absl::InfiniteDuration();
  auto it = request.cached_tokens.find(worker.ref.id);
  const int64_t cached = it == request.cached_tokens.end() ? 0 : it->second;
  const int64_t tokens =
      std::max<int64_t>(0, worker.load.queued_prefill_tokens) +
      std::max<int64_t>(0, request.prompt_tokens - cached);
  return absl::Seconds(static_cast<double>(tokens) / rate);
}

namespace {

// Refused by a count limit: `count` requests `what`, the limit `flag`.
AdmissionVerdict Full(absl::string_view reason, int64_t count,
                      absl::string_view what, absl::string_view flag) {
  AdmissionVerdict verdict;
  verdict.reason = reason;
  verdict.retry_after = absl::Seconds(1);
  verdict.status = absl::ResourceExhaustedError(absl::StrFormat(
      "overloaded: %d requests %s, the limit (%s); retry after %s", count, what,
      flag, absl::FormatDuration(verdict.retry_after)));
  return verdict;
}

}  // namespace

AdmissionVerdict Admit(const AdmissionOptions& options,
                       const Candidates& candidates, const RequestInfo& request,
                       int64_t waiting_requests, int64_t running_requests) {
  if (options.max_waiting_requests > 0 &&
      waiting_requests >= options.max_waiting_requests) {
    return Full(kQueueFull, waiting_requests,
                "are waiting for their first token", "--max_waiting_requests");
  }
  if (options.max_running_requests > 0 &&
      running_requests >= options.max_running_requests) {
    return Full(kRunningFull, running_requests, "are running",
                "--max_running_requests");
  }
  AdmissionVerdict verdict;
  const WorkerRole role = PrefillRole(candidates, request.model_id);
  absl::StatusOr<std::vector<const WorkerInfo*>> eligible =
      EligiblePrefill(candidates, request);
  if (!eligible.ok()) return verdict;  // the route reports it
  bool unmeasured = false;
  const WorkerInfo* best = nullptr;
  for (const WorkerInfo* w : *eligible) {
    if (w->registration.role != role) continue;
    const absl::Duration estimate = EstimateTtft(*w, request);
    if (estimate == absl::InfiniteDuration()) unmeasured = true;
    if (estimate < verdict.estimated_ttft) {
      verdict.estimated_ttft = estimate;
      best = w;
    }
  }
  if (unmeasured) verdict.estimated_ttft = absl::InfiniteDuration();
  if (options.ttft_slo <= absl::ZeroDuration() || unmeasured ||
      best == nullptr || verdict.estimated_ttft <= options.ttft_slo) {
    return verdict;
  }
  verdict.reason = kTtftSlo;
  verdict.retry_after = std::max(
      absl::Seconds(1),
      absl::Ceil(verdict.estimated_ttft - options.ttft_slo, absl::Seconds(1)));
  verdict.status = absl::ResourceExhaustedError(absl::StrFormat(
      "overloaded: estimated time to first token %.0f ms (%s: %d prompt "
      "tokens queued + %d, at %.0f tokens/s) is above the limit "
      "(--ttft_slo_ms) of %.0f ms; retry after %s",
      Millis(verdict.estimated_ttft), best->ref.id,
      best->load.queued_prefill_tokens, request.prompt_tokens,
      best->load.prefill_tokens_per_second, Millis(options.ttft_slo),
      absl::FormatDuration(verdict.retry_after)));
  return verdict;
}

}  // namespace baton::coordinator
