// Admission: whether a new request may start, decided on its arrival from
// what the coordinator already knows, so an overloaded cluster answers
// RESOURCE_EXHAUSTED at once instead of queueing the request until its
// queue timeout (and holding its resources meanwhile).
//
// Three limits:
//   - the queue: requests admitted and not yet at their first token; one
//     more than max_waiting_requests is refused ("queue_full");
//   - the streams: requests admitted and not yet ended, whatever their
//     phase (what the coordinator's memory holds a stream for); one more
//     than max_running_requests is refused ("running_full");
//   - the time to first token: the estimate is the least, over the workers
//     that would prefill it, of (prompt tokens queued there + this prompt's
//     tokens the worker's prefix cache does not hold) / the prefill rate the
//     worker measured (WorkerLoad.prefill_tokens_per_second). Above
//     ttft_slo the request is refused ("ttft_slo"). The rate is measured,
//     not the queue alone, so the estimate follows the hardware and the
//     prompt lengths rather than a fixed count of requests. A worker that
//     has not measured its rate yet (no prefill since it started) gives no
//     estimate: with such a worker in the pool nothing is refused on time.
//     The wait for decode room (split serving) is not in the estimate; the
//     queue bound and --queue_timeout_ms cover it.
// No gRPC, no threads, no clock: the caller passes the registry's view.
#ifndef BATON_COORDINATOR_ADMISSION_H_
#define BATON_COORDINATOR_ADMISSION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "coordinator/routing_policy.h"

namespace baton::coordinator {

struct AdmissionOptions {
  // Refuse a request whose estimated time to first token is above this.
  // Zero: no refusal on the estimate.
  absl::Duration ttft_slo = absl::ZeroDuration();
  // Requests admitted and not yet at their first token, at most. 0: no
  // bound.
  int64_t max_waiting_requests = 1024;
  // Requests admitted and not yet ended, at most. 0: no bound.
  int64_t max_running_requests = 16384;
};

// InvalidArgument naming the option when negative.
absl::Status ValidateAdmissionOptions(const AdmissionOptions& options);

struct AdmissionVerdict {
  // OK: admitted. RESOURCE_EXHAUSTED: refused, naming the limit and the
  // figures.
  absl::Status status;
  // The metric label of the limit that refused: "queue_full" or
  // "ttft_slo"; empty when admitted.
  absl::string_view reason;
  // When refused: how long a client should wait before it tries again
  // (the estimate's excess over the SLO, at least 1 s; 1 s for a full
  // queue).
  absl::Duration retry_after = absl::ZeroDuration();
  // The estimate for this request; InfiniteDuration when there is none.
  absl::Duration estimated_ttft = absl::InfiniteDuration();
};

// The wait before `request`'s first token if `worker` prefilled it: queued
// prompt tokens plus this prompt's uncached ones (request.cached_tokens),
// over the worker's measured rate. InfiniteDuration without a rate.
absl::Duration EstimateTtft(const WorkerInfo& worker,
                            const RequestInfo& request);

// The verdict for `request` given the registry's view (with the
// coordinator's own bookkeeping added, Cluster::RoutingCandidates) and the
// numbers of requests already admitted and waiting for their first token,
// and admitted and not yet ended (`running_requests`, >= waiting).
// The pool is the one GenerateCall routes to (SplitServing): prefill-role
// workers when one is up, else `both` workers; an empty pool admits (the
// route then names the missing workers).
AdmissionVerdict Admit(const AdmissionOptions& options,
                       const Candidates& candidates, const RequestInfo& request,
                       int64_t waiting_requests, int64_t running_requests = 0);

}  // namespace baton::coordinator

#endif  // BATON_COORDINATOR_ADMISSION_H_
