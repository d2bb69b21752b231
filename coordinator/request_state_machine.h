// The lifecycle of every request, the one owner of its KV leases, of the
// load it puts on workers, of its timers and of its retry budget.
//
//   QUEUED ─▶ PREFILLING ─▶ TRANSFERRING ─▶ DECODING ─▶ FINISHED
//     ▲ └─────────┴──────────────┴──────────────┴──▶ CANCELLED | FAILED
//     └─────────────┴──────────────┴──────────────┘  new attempt (retry or
//                                                     migration)
//
// A request runs as one or more attempts; each has its own id, the one
// workers see (the request id, then "<id>/retry<n>" or "<id>/migrate<n>"),
// so a new attempt never meets what an old one left on a worker. When a
// worker fails an attempt (a Prefill or Decode RPC breaks with UNAVAILABLE,
// or the worker goes DOWN: the typed payloads of worker_rpc.h, never the
// message text), the request goes back to QUEUED under a new attempt,
// without that worker incarnation, while its budget lasts: up to
// max_attempts attempts before the first token reached the client, then up
// to max_migrations more after it (the new attempt continues the client's
// stream); past the budget, or for any other error, it FAILS.
//
// Who holds KV blocks for an attempt (a lease in the ledger):
//   QUEUED        the decode worker, from ReserveDecode (if reserved);
//   PREFILLING    the prefill worker, and the decode worker (split);
//   TRANSFERRING  both, until the decode worker acknowledges the last layer;
//   DECODING      the decode worker only (the prefill worker freed its copy
//                 at the handoff);
//   terminal      nobody.
// A colocated attempt (StartPrefill without a reservation) keeps one lease
// on its worker from PREFILLING to the end and skips TRANSFERRING.
//
// The load a request puts on workers, as routing sees it before heartbeats
// catch up (Loads()): its prompt tokens on the prefill worker from
// StartPrefill to the first token, and its reserved blocks and one
// sequence on the decode worker from ReserveDecode to the end of the
// attempt (colocated: one sequence on its worker from StartPrefill on).
//
// Timers, on the injected clock: the request's deadline (any live state),
// the queue timeout (QUEUED, from admission or the start of the attempt,
// while no decode worker holds a reservation), the transfer timeout
// (TRANSFERRING). ExpireDeadlines fires them.
//
// Every event returns a Transition listing the cleanup actions the caller
// must perform on workers; the state machine itself does no I/O. Edges that
// end an attempt emit one action per live lease, except on a worker that is
// DOWN (its pool is gone). Worker.Cancel is idempotent, so an action for a
// lease the worker already freed is harmless.
//
// Thread-safe.
#ifndef BATON_COORDINATOR_REQUEST_STATE_MACHINE_H_
#define BATON_COORDINATOR_REQUEST_STATE_MACHINE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/clock.h"
#include "coordinator/lease_ledger.h"
#include "coordinator/types.h"
#include "coordinator/worker_rpc.h"

namespace baton::coordinator {

enum class RequestState {
  kQueued,
  kPrefilling,
  kTransferring,
  kDecoding,
  kFinished,
  kCancelled,
  kFailed,
};
absl::string_view RequestStateName(RequestState state);  // "QUEUED", ...
bool IsTerminal(RequestState state);

// Work the caller must do on a worker after an edge. Both kinds map to the
// Worker.Cancel RPC; they differ in what the worker is doing.
struct CleanupAction {
  enum class Kind {
    // The worker holds blocks but runs nothing for the request (a decode
    // reservation, possibly with a transfer landing): free them.
    kFreeKv,
    // The worker runs a Prefill or Decode stream for the request: end it
    // and free its blocks.
    kCancelOnWorker,
  };
  Kind kind;
  WorkerRef worker;
  // The attempt's id (what the worker knows).
  std::string request_id;

  bool operator==(const CleanupAction&) const = default;
};
CleanupAction FreeKv(WorkerRef worker, absl::string_view request_id);
CleanupAction CancelOnWorker(WorkerRef worker, absl::string_view request_id);
std::ostream& operator<<(std::ostream& os, const CleanupAction& action);

// "no worker had room for the request within <queue_timeout>": the start of
// the error of a request that waited its queue timeout.
std::string QueueTimeoutMessage(absl::Duration queue_timeout);

// The result of one event on one request.
struct Transition {
  std::string request_id;
  // The attempt the event acted on (what its actions name).
  std::string attempt_id;
  RequestState from;
  RequestState to;
  // In the order to perform them (prefill side first).
  std::vector<CleanupAction> actions;
  // OK unless the event ended the attempt: then why. For CANCELLED or
  // FAILED the error for the client (CANCELLED, DEADLINE_EXCEEDED,
  // UNAVAILABLE for a dead worker: retriable, RESOURCE_EXHAUSTED when no
  // decode worker would take it, or the failed phase's own status); for a
  // new attempt, the failure that caused it.
  absl::Status status;
  // The attempt ended and the request goes on, QUEUED, under a new attempt
  // id; `migration` when the client already has tokens.
  bool new_attempt = false;
  bool migration = false;
};

struct RequestSpec {
  // >= 1.
  int64_t prompt_tokens = 1;
  // >= 0.
  int64_t max_tokens = 0;
  // The request fails with DEADLINE_EXCEEDED at ExpireDeadlines(t >= this).
  absl::Time deadline = absl::InfiniteFuture();
};

struct RequestStateMachineOptions {
  // Decode reservations refused (or lost to a DOWN worker) before the
  // request fails with RESOURCE_EXHAUSTED. >= 1.
  int max_decode_attempts = 3;
  // Attempts before the first token reached the client (a worker failed
  // each of the others). >= 1.
  int max_attempts = 3;
  // New attempts after it (migrations). >= 0.
  int max_migrations = 2;
  // How long an attempt may stay QUEUED without a decode reservation before
  // the request fails with RESOURCE_EXHAUSTED; also RequestSnapshot's
  // queue_deadline, for the router's own waits. >= 0.
  absl::Duration queue_timeout = absl::InfiniteDuration();
  // How long an attempt may stay TRANSFERRING before it fails with
  // DEADLINE_EXCEEDED. > 0.
  absl::Duration transfer_timeout = absl::InfiniteDuration();
  // Time source of the queue and transfer timers; null: RealClock().
  const Clock* clock = nullptr;
};

// One request as the state machine sees it.
struct RequestSnapshot {
  RequestState state;
  // The current attempt: its id (what workers see) and number (1-based).
  std::string attempt_id;
  int attempt = 1;
  int migrations = 0;
  // Some attempt reached its first token (the client may have it).
  bool first_token = false;
  std::optional<WorkerRef> prefill_worker;
  std::optional<WorkerRef> decode_worker;
  bool colocated = false;
  // Decode workers that refused a reservation of the current attempt or
  // went DOWN holding one.
  std::vector<WorkerId> tried_decode_workers;
  // Worker incarnations that failed an attempt (the request avoids them;
  // a new incarnation of the same worker may serve it).
  std::vector<WorkerRef> excluded_prefill;
  std::vector<WorkerRef> excluded_decode;
  // When the current attempt's wait for a decode worker ends.
  absl::Time queue_deadline = absl::InfiniteFuture();
  absl::Status status;
};

// Load the coordinator's own requests put on one worker (Loads()).
struct RequestLoad {
  // Prompt tokens sent and not yet prefilled.
  int64_t prefill_tokens = 0;
  // Blocks of live decode reservations.
  int64_t decode_blocks = 0;
  // Requests that decode there and have not ended: a split one from its
  // decode reservation on, a colocated one from its prefill on (the
  // sequences the worker runs, or will once their prompts are prefilled).
  int64_t sequences = 0;
  // Reservations made within the room known here (not those sent to wait
  // for room) whose ReserveKv has not been answered yet. A request sent to
  // wait in the worker's line is held back while any is: the worker serves
  // whatever reaches it first, and a reservation the coordinator granted
  // earlier may still be on its way (its thread descheduled before the
  // call went out, the call itself slow).
  int64_t grants_in_flight = 0;

  bool operator==(const RequestLoad&) const = default;
};

class RequestStateMachine {
 public:
  explicit RequestStateMachine(const RequestStateMachineOptions& options = {});
  RequestStateMachine(const RequestStateMachine&) = delete;
  RequestStateMachine& operator=(const RequestStateMachine&) = delete;

  // Creates the request in QUEUED, its first attempt's id equal to
  // `request_id`. AlreadyExists for a known id (terminal ones included
  // until Forget); InvalidArgument for an empty id or counts out of range.
  absl::Status Admit(absl::string_view request_id, const RequestSpec& spec);

  // --- Forward edges ---------------------------------------------------------
  // Everywhere below `attempt_id` names the attempt the event is about (the
  // request id for the first): FailedPrecondition (the first attempt) or
  // NotFound (a later one) for an attempt that is over (the request went on
  // under a new one); NotFound for an unknown id;
  // FailedPrecondition naming the current and the required state for an
  // event the state does not accept (terminal states accept none).

  // QUEUED: the decode worker is asked to reserve `blocks` blocks (its
  // load from now on); its lease starts now (a reservation whose reply is
  // lost still holds blocks). FailedPrecondition if a reservation is
  // already held. Unless it `waits` (sent to wait for room in the worker's
  // line), it is a grant in flight until OnReserved or the reservation's
  // end (RequestLoad::grants_in_flight).
  absl::StatusOr<Transition> ReserveDecode(absl::string_view attempt_id,
                                           const WorkerRef& decode_worker,
                                           int64_t blocks = 0,
                                           bool waits = false);
  // Any live state holding a reservation: the worker answered its ReserveKv
  // (it holds the blocks); no change of state. FailedPrecondition when no
  // reservation is held (the attempt dropped it meanwhile).
  absl::Status OnReserved(absl::string_view attempt_id);
  // QUEUED, reserved on `decode_worker`: the ReserveKv call failed with
  // `why`. RESOURCE_EXHAUSTED, INVALID_ARGUMENT or FAILED_PRECONDITION: the
  // worker refused, nothing was held; any other code: the reply may have
  // been lost after the worker reserved, so the action frees the blocks.
  // The request stays QUEUED for another decode worker, or FAILS with
  // RESOURCE_EXHAUSTED after max_decode_attempts.
  absl::StatusOr<Transition> OnReserveRefused(absl::string_view attempt_id,
                                              const WorkerRef& decode_worker,
                                              const absl::Status& why);
  // QUEUED -> PREFILLING; the prompt's tokens count as load on
  // `prefill_worker` until the first token. With a reservation, a split
  // attempt (InvalidArgument if `prefill_worker` is the reserved decode
  // worker); without one, colocated: `prefill_worker` decodes too. With
  // `split`, a reservation is required: if it was lost meanwhile (its
  // worker went DOWN), UNAVAILABLE with kWorkerDownPayload, changing
  // nothing (end the attempt with it: OnAttemptFailed). A colocated
  // attempt on a worker whose KV room the coordinator accounts for (a
  // decode worker prefilling locally) counts `blocks` there as a
  // reservation would, until the attempt ends.
  absl::StatusOr<Transition> StartPrefill(absl::string_view attempt_id,
                                          const WorkerRef& prefill_worker,
                                          bool split = false,
                                          int64_t blocks = 0);
  // PREFILLING -> TRANSFERRING (split) or -> DECODING (colocated): the first
  // token was sampled.
  absl::StatusOr<Transition> OnFirstToken(absl::string_view attempt_id);
  // TRANSFERRING -> DECODING: the decode worker acknowledged the last layer;
  // the prefill worker freed its copy (its lease ends, no action).
  absl::StatusOr<Transition> OnHandoff(absl::string_view attempt_id);
  // DECODING -> FINISHED: the Decode stream ended normally; the decode
  // worker freed the blocks (its lease ends, no action).
  absl::StatusOr<Transition> OnFinished(absl::string_view attempt_id);

  // --- Abort edges (any live state) -----------------------------------------
  // Cancel and OnDeadline name the request (whatever its attempt).
  // -> CANCELLED.
  absl::StatusOr<Transition> Cancel(absl::string_view request_id,
                                    absl::string_view reason);
  // -> FAILED (DEADLINE_EXCEEDED).
  absl::StatusOr<Transition> OnDeadline(absl::string_view request_id);
  // TRANSFERRING -> FAILED (DEADLINE_EXCEEDED naming the transfer).
  absl::StatusOr<Transition> OnTransferTimeout(absl::string_view attempt_id);
  // Any live state: the attempt failed with `error` (a worker RPC failed,
  // the router gave up, the call was aborted). When `error` says a worker
  // failed (UNAVAILABLE with kWorkerDownPayload, or with kWorkerRpcPayload
  // kPrefill, kPrefillHandoff or kDecode, naming a worker the attempt holds)
  // or that the KV bytes arrived corrupted (DATA_LOSS with kPrefillHandoff
  // or kDecode), and the budget allows, -> QUEUED under a new attempt,
  // excluding the failed worker (none for corrupted bytes); otherwise
  // -> CANCELLED for a CANCELLED error, -> FAILED with `error` for any
  // other.
  // REQUIRES: !error.ok().
  absl::StatusOr<Transition> OnAttemptFailed(absl::string_view attempt_id,
                                             const absl::Status& error);

  // --- Sweeps ----------------------------------------------------------------
  // By request id, every live request whose timer expired at `now`:
  // OnDeadline past its deadline; OnTransferTimeout past transfer_timeout in
  // TRANSFERRING; FAILED with RESOURCE_EXHAUSTED past its queue deadline in
  // QUEUED without a reservation. Looks only at requests with a timer due
  // by `now` (a heap of timers), so a sweep with thousands of requests in
  // flight and none due costs almost nothing.
  std::vector<Transition> ExpireDeadlines(absl::Time now);
  // Every live request holding a lease on `worker` or an older incarnation
  // of it, by request id: a QUEUED reservation is dropped (the request stays
  // QUEUED for another decode worker, as OnReserveRefused); any other state
  // ends the attempt as OnAttemptFailed with UNAVAILABLE and
  // kWorkerDownPayload (a new attempt, or FAILED past the budget). Leases on
  // the dead worker end as kWorkerDown without actions; the others get
  // actions.
  std::vector<Transition> OnWorkerDown(const WorkerRef& worker);
  // Of the attempt ids a worker reports holding, those it should not hold:
  // the coordinator has no live lease for them on this incarnation
  // (HeartbeatResponse.orphaned_request_ids), in the given order.
  std::vector<std::string> Orphans(
      const WorkerRef& worker,
      const std::vector<std::string>& leased_request_ids) const;

  // --- Queries ---------------------------------------------------------------
  absl::StatusOr<RequestSnapshot> Get(absl::string_view request_id) const;
  // Drops a terminal request. FailedPrecondition for a live one.
  absl::Status Forget(absl::string_view request_id);
  // The load of every worker with some (by worker id).
  std::map<WorkerId, RequestLoad> Loads() const;
  // Calls visit(worker, load) for each worker in Loads(), under the lock:
  // no copy. `visit` must not call back into the state machine.
  void VisitLoads(
      absl::FunctionRef<void(const WorkerId&, const RequestLoad&)> visit) const;
  // The load on one worker (zero when it has none).
  RequestLoad LoadOn(const WorkerId& worker) const;
  // Leases name attempt ids.
  std::vector<Lease> LiveLeases() const;
  std::vector<Lease> LiveLeasesOn(absl::string_view worker_id) const;
  // Timers waiting in the sweep's heap, stale ones included (each leaves
  // at its due time).
  int64_t pending_timers() const;
  // Counts of acquired and released leases (total and by kind).
  int64_t leases_acquired() const;
  int64_t leases_released(std::optional<LeaseRelease> how = {}) const;
  // Every request's leases agree with its state (table above) and with the
  // ledger, acquired == released + live, and Loads() is the sum of the
  // requests' loads. Internal if not, naming the first request that
  // disagrees.
  absl::Status CheckInvariants() const;

 private:
  struct Record {
    RequestSpec spec;
    RequestState state = RequestState::kQueued;
    std::string attempt_id;
    int attempt = 1;
    int migrations = 0;
    bool first_token = false;
    std::optional<WorkerRef> prefill;
    std::optional<WorkerRef> decode;
    bool colocated = false;
    std::vector<WorkerId> tried_decode;
    std::vector<WorkerRef> excluded_prefill;
    std::vector<WorkerRef> excluded_decode;
    // Load counted on prefill / decode (RequestLoad).
    int64_t prefill_tokens = 0;
    int64_t decode_blocks = 0;
    bool counts_sequence = false;  // on `decode`
    bool grant_in_flight = false;  // on `decode`
    absl::Time queue_deadline = absl::InfiniteFuture();
    absl::Time transferring_since = absl::InfiniteFuture();
    absl::Status status;
    // The earliest timer of this record in timers_ not yet swept
    // (InfiniteFuture: none). Invariant for a live record:
    // armed <= DueLocked(rec).
    absl::Time armed = absl::InfiniteFuture();
  };
  // A record's timer in timers_: when ExpireDeadlines must look at it. May
  // be stale (the record moved on, or was forgotten): the sweep checks the
  // record itself.
  struct Timer {
    absl::Time due;
    std::string request_id;
  };

  absl::StatusOr<Record*> FindLocked(absl::string_view request_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The record whose current attempt is `attempt_id`; sets *request_id.
  absl::StatusOr<Record*> FindAttemptLocked(absl::string_view attempt_id,
                                            std::string* request_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FailedPrecondition unless `rec` is in one of `allowed`.
  absl::Status ExpectLocked(absl::string_view request_id, const Record& rec,
                            absl::string_view event,
                            std::initializer_list<RequestState> allowed) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // FindAttemptLocked, then ExpectLocked.
  absl::StatusOr<Record*> FindInStateLocked(
      absl::string_view attempt_id, absl::string_view event,
      std::initializer_list<RequestState> allowed, std::string* request_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends every lease of the attempt and its load: workers matching `down`
  // (same id, epoch <= down's) without an action, the others with one.
  // Returns the transition from rec.state (unchanged) with its actions.
  Transition EndLeasesLocked(absl::string_view request_id, Record& rec,
                             const std::optional<WorkerRef>& down)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves to terminal `to` (EndLeasesLocked first).
  Transition TerminateLocked(absl::string_view request_id, Record& rec,
                             RequestState to, absl::Status status,
                             const std::optional<WorkerRef>& down = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OnAttemptFailed's decision (`down`: as TerminateLocked).
  Transition FailAttemptLocked(absl::string_view request_id, Record& rec,
                               const absl::Status& error,
                               const std::optional<WorkerRef>& down = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds `delta` to the load of `worker`.
  void AddLoadLocked(const WorkerId& worker, const RequestLoad& delta)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the reservation's load.
  void DropDecodeLoadLocked(Record& rec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the QUEUED reservation (refused or lost) and records the attempt;
  // fails the request when attempts are used up.
  Transition DropReservationLocked(absl::string_view request_id, Record& rec,
                                   LeaseRelease how, const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckRecordLocked(absl::string_view request_id,
                                 const Record& rec) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // When the first of the record's timers fires in its current state (its
  // deadline; the transfer timeout in TRANSFERRING; the queue deadline in
  // QUEUED without a reservation); InfiniteFuture for none or a terminal
  // record.
  absl::Time DueLocked(const Record& rec) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Puts the record's due time in timers_ unless an earlier one is there.
  // Called after every edge that can bring a timer closer.
  void ArmLocked(absl::string_view request_id, Record& rec)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RequestStateMachineOptions options_;
  const Clock* const clock_;
  mutable absl::Mutex mu_;
  std::map<std::string, Record, std::less<>> requests_ ABSL_GUARDED_BY(mu_);
  LeaseLedger ledger_ ABSL_GUARDED_BY(mu_);
  std::map<WorkerId, RequestLoad> loads_ ABSL_GUARDED_BY(mu_);
  // Current attempt id -> request id, for every known request.
  std::map<std::string, std::string, std::less<>> attempts_
      ABSL_GUARDED_BY(mu_);
  // Min-heap on due (std::push_heap with a greater-than order): a sweep
  // looks only at the records whose timers are due, not at every request.
  std::vector<Timer> timers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::coordinator

#endif  // BATON_COORDINATOR_REQUEST_STATE_MACHINE_H_
