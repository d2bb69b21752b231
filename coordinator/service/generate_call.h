// One Generate request, driven start to finish by a coroutine that holds no
// thread while it waits (on a worker's RPC, a backoff): it runs on the
// cluster's executor, and its worker calls use gRPC's callback API.
//
//   route ─▶ [ReserveKv on the decode worker] ─▶ Prefill ─▶ first token to
//   the client ─▶ Decode (started before the handoff completes; the decode
//   worker waits for the last layer) ─▶ tokens to the client ─▶ result.
//
// With ClusterOptions::overlap_reserve_kv the first attempt sends Prefill
// at once and makes the reservation beside it (ReserveKv, then SetKvTarget
// on the prefill worker); Decode waits for it.
//
// The call does the I/O only: the cluster's RequestStateMachine owns the
// request's lifecycle (its leases, the load it puts on workers, its timers,
// its retry budget). Every step is an edge of it; when an attempt fails
// (a worker RPC breaks, the client cancels, a timer fires) the call hands
// the error to the state machine (OnAttemptFailed) and performs the cleanup
// it returns, then does what it decided: a new attempt, or the end of the
// request. Errors before the first token are the RPC's status; after it, an
// in-band FINISH_REASON_ERROR result.
//
// A worker that dies: before the first token reached the client (the
// prefill worker was gone or died mid-prompt, or either worker went DOWN),
// the request starts over without it, up to ClusterOptions::max_attempts in
// all. After it, the request migrates, up to max_migrations times: when
// its decode worker fails (the Decode stream breaks, the worker goes DOWN or
// ends the request on its own) or its prefill worker fails mid-handoff, a
// new attempt prefills the prompt again (its first token must equal the
// one streamed) and hands the KV to another decode worker, whose Decode
// continues from every token the client already has: the random stream is
// counter-based and the kernels batch-invariant, so the rest of the output
// is the one a fault-free run gives, with no gap and no duplicate. A
// colocated request moves to another `both` worker, which generates again
// the tokens the client has and streams from the first it lacks. Past the
// budget the request fails with UNAVAILABLE (retriable).
#ifndef BATON_COORDINATOR_SERVICE_GENERATE_CALL_H_
#define BATON_COORDINATOR_SERVICE_GENERATE_CALL_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "baton/v1/api.pb.h"
#include "baton/v1/worker.grpc.pb.h"
#include "common/async/task.h"
#include "common/grpc/stream_reactor.h"
#include "common/metrics/histogram_accumulator.h"
#include "coordinator/service/cluster.h"

namespace baton::coordinator {

using GenerateReactor = StreamReactor<v1::GenerateResponse>;

// A validated request, ready to run.
struct GenerateJob {
  // Unique in the cluster; what workers see.
  std::string internal_id;
  // What the client sees (its own id, or internal_id).
  std::string client_id;
  std::vector<int32_t> prompt;
  // Validated; seed set (drawn if the client gave none).
  v1::SamplingParams sampling;
  // Client deadline (InfiniteFuture if none).
  absl::Time deadline = absl::InfiniteFuture();
  // When the call reached the coordinator (its handler sets it; the Unix
  // epoch, sent as 0, is "unknown"): the order in which workers admit
  // prompts (PrefillRequest.arrival_unix_micros).
  absl::Time arrival = absl::UnixEpoch();
};

// Validates `request` against options.limits and the served model:
// InvalidArgument naming the field (request_id, model, prompt, sampling.*)
// and the limit, NotFound for another model. The job's id is unique among
// the replicas (it carries options.coordinator_id).
absl::StatusOr<GenerateJob> PrepareGenerate(const ServedModel& model,
                                            const ClusterOptions& options,
                                            const v1::GenerateRequest& request,
                                            absl::Time deadline);

// What routing and admission see of `job` (its prompt must outlive the
// result).
RequestInfo RoutingInfo(const GenerateJob& job, const std::string& model_id);

class GenerateCall final : public CallHandle,
                           public std::enable_shared_from_this<GenerateCall> {
 public:
  // Runs `job` on the cluster's executor, streaming into `reactor` (which
  // the call closes exactly once). The job was admitted (Cluster::Admit); the
  // call ends its waiting. The cluster must outlive the call (its destructor
  // waits for running calls).
  static void Start(Cluster* cluster, GenerateJob job,
                    GenerateReactor* reactor);

  void Abort(absl::string_view attempt_id, const absl::Status& status) override;

  GenerateCall(Cluster* cluster, GenerateJob job, GenerateReactor* reactor);
  ~GenerateCall() override;

 private:
  using SteadyClock = std::chrono::steady_clock;

  // Registers a client context so Abort can cancel it; cancels it at once
  // if the call is already aborted.
  class ScopedContext;

  // The request, start to finish; `self` keeps the call alive until then.
  async::Detach Run(std::shared_ptr<GenerateCall> self);
  // Reads the state machine's current attempt (id, excluded workers, queue
  // deadline) and clears the previous attempt's routing outcome.
  void BeginAttempt();
  // The attempt failed with *status: the state machine decides (or already
  // did, if the sweeper ended the attempt). True: go on with a new attempt;
  // false: the request ends with *status.
  bool EndAttempt(absl::Status* status);
  // Picks the workers and, for a split request, reserves the decode blocks
  // (or, with ClusterOptions::overlap_reserve_kv, prepares the reservation
  // Serve makes beside the Prefill).
  async::Task<absl::Status> Route();
  // A reservation made beside the Prefill, and the awaiter of its end
  // (generate_call_internal.h).
  struct Overlap;
  class OverlapAwaiter;
  // ReserveKv on `decode` for attempt `attempt`, then SetKvTarget on
  // `prefill`; a failure aborts that attempt. `self` keeps the call alive.
  async::Detach ReserveBesidePrefill(std::shared_ptr<GenerateCall> self,
                                     std::shared_ptr<Overlap> overlap,
                                     std::string attempt, WorkerInfo decode,
                                     WorkerInfo prefill);
  // The ids of the `failed` incarnations that are still the registry's
  // current ones (for RequestInfo::excluded).
  std::vector<WorkerId> StillExcluded(
      const std::vector<WorkerRef>& failed) const;
  // Picks the prefill worker among those of `role` (prefill_) and starts the
  // attempt's prefill in the state machine, avoiding excluded_prefill_;
  // while that pool has no healthy worker but a suspect one, waits for it
  // until `queue_deadline`.
  async::Task<absl::Status> ClaimPrefill(WorkerRole role, RequestInfo request,
                                         absl::Time queue_deadline);
  // Prefill, first token, Decode and the stream to the client.
  async::Task<absl::Status> Serve();
  // Reports `why` to the client (the state machine has ended the request).
  void Fail(absl::Status why);
  void SendFirstToken(const v1::PrefillFirstToken& first);
  void SendResult(const v1::DecodeResult& result);
  // The request is no longer waiting for its first token (Cluster::Admit
  // counted it); once.
  void LeaveWaiting();
  // Records the request's end in the cluster's metrics (once; before the
  // client's stream is closed, so a client that saw the end sees it
  // counted).
  void RecordEnd(const absl::Status& status, v1::FinishReason reason);
  v1::GenerateResult BaseResult() const;
  // co_await Backoff(d): waits up to `d` (on a timer, no thread held);
  // false if the call (or its attempt) was aborted meanwhile.
  class BackoffAwaiter;
  BackoffAwaiter Backoff(absl::Duration d);
  // Why the request or its current attempt was aborted (OK: it was not).
  absl::Status aborted() const;
  // Why the request as a whole was aborted (client, deadline, shutdown).
  absl::Status request_aborted() const;
  void SetDeadline(grpc::ClientContext* context) const;

  Cluster* const cluster_;
  const GenerateJob job_;     // internal_id: the state machine's request id
  GenerateReactor* reactor_;  // null once closed

  // The current attempt, from the state machine (BeginAttempt): its id
  // (what workers see), the worker incarnations that failed the request (a
  // worker that registers again, with a new epoch, may serve it), and when
  // its wait for a worker ends.
  std::string attempt_;
  std::vector<WorkerRef> excluded_prefill_;
  std::vector<WorkerRef> excluded_decode_;
  absl::Time queue_deadline_ = absl::InfiniteFuture();
  int migrations_ = 0;  // the request's, for the result
  int retries_ = 0;     // attempts started over before the first token
  const SteadyClock::time_point arrival_;

  // Routing outcome.
  std::optional<WorkerInfo> prefill_;
  std::optional<WorkerInfo> decode_;  // unset: colocated on prefill_
  v1::ReserveKvResponse reservation_;
  // Route's ReserveKv, for Serve to send beside the Prefill.
  std::optional<v1::ReserveKvRequest> overlap_request_;
  // Serve's reservation beside the Prefill until Serve waited for its end;
  // Run waits for one Serve left early (nothing of an attempt outlives it).
  std::shared_ptr<Overlap> overlap_in_flight_;
  bool reserved_beside_prefill_ = false;  // for the result's timings

  // Progress, for the result.
  bool streamed_ = false;  // at least one message sent to the client
  int32_t completion_tokens_ = 0;
  // Tokens and bytes of text the client has: where a migrated attempt's
  // decode worker continues from.
  std::vector<int32_t> generated_;
  int64_t emitted_text_bytes_ = 0;
  double queue_ms_ = 0;
  double reserve_kv_ms_ = 0;  // the successful ReserveKv's round trip
  double prefill_ms_ = 0;
  int32_t cached_tokens_ = 0;  // the first attempt's prefix cache hit
  double ttft_ms_ = 0;
  SteadyClock::time_point first_token_time_;
  SteadyClock::time_point last_token_time_;
  SteadyClock::time_point activity_reported_;  // RecordActivity, throttled
  v1::PrefillHandoff handoff_;
  bool prefill_started_ = false;  // queue_ms_ is set
  bool end_recorded_ = false;
  bool waiting_ = true;  // admitted, before the first token
  metrics::HistogramAccumulator inter_token_;  // gaps between tokens

  mutable absl::Mutex mu_;
  absl::Status abort_ ABSL_GUARDED_BY(mu_);
  // attempt_, for Abort, and why the state machine ended that attempt (a
  // worker it used went DOWN, a timer) when the request itself was not
  // aborted.
  std::string attempt_id_ ABSL_GUARDED_BY(mu_);
  absl::Status attempt_abort_ ABSL_GUARDED_BY(mu_);
  std::vector<grpc::ClientContext*> contexts_ ABSL_GUARDED_BY(mu_);
  // The timer of the backoff under way (0: none); Abort fires it early.
  uint64_t backoff_timer_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace baton::coordinator

#endif  // BATON_COORDINATOR_SERVICE_GENERATE_CALL_H_
