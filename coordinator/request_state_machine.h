// The lifecycle of every request and the one place that owns its KV leases.
//
//   QUEUED ─▶ PREFILLING ─▶ TRANSFERRING ─▶ DECODING ─▶ FINISHED
//     └──────────┴──────────────┴──────────────┴──▶ CANCELLED | FAILED
//
// Who holds KV blocks for a request (a lease in the ledger):
//   QUEUED        the decode worker, from ReserveDecode (if reserved);
//   PREFILLING    the prefill worker, and the decode worker (split);
//   TRANSFERRING  both, until the decode worker acknowledges the last layer;
//   DECODING      the decode worker only (the prefill worker freed its copy
//                 at the handoff);
//   terminal      nobody.
// A colocated request (StartPrefill without a reservation) keeps one lease on
// its worker from PREFILLING to the end and skips TRANSFERRING.
//
// Every event returns a Transition listing the cleanup actions the caller
// must perform on workers; the state machine itself does no I/O. Edges to
// CANCELLED / FAILED emit one action per live lease, except on a worker that
// is DOWN (its pool is gone). Worker.Cancel is idempotent, so an action for a
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
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/lease_ledger.h"
#include "coordinator/types.h"

namespace baton::coordinator {

// Payload type URL on the UNAVAILABLE status of a request that failed
// because a worker holding one of its leases went DOWN (OnWorkerDown): the
// attempt is lost, not the request, which may resume elsewhere. Its value
// is the id of the worker that went DOWN.
inline constexpr absl::string_view kWorkerDownPayload =
    "type.baton.dev/baton.WorkerDown";

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
  std::string request_id;

  bool operator==(const CleanupAction&) const = default;
};
CleanupAction FreeKv(WorkerRef worker, absl::string_view request_id);
CleanupAction CancelOnWorker(WorkerRef worker, absl::string_view request_id);
std::ostream& operator<<(std::ostream& os, const CleanupAction& action);

// The result of one event on one request.
struct Transition {
  std::string request_id;
  RequestState from;
  RequestState to;
  // In the order to perform them (prefill side first).
  std::vector<CleanupAction> actions;
  // OK unless `to` is CANCELLED or FAILED; then the error for the client
  // (CANCELLED, DEADLINE_EXCEEDED, UNAVAILABLE for a dead worker: retriable,
  // RESOURCE_EXHAUSTED when no decode worker would take it, or the failed
  // phase's own status).
  absl::Status status;
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
};

// One request as the state machine sees it.
struct RequestSnapshot {
  RequestState state;
  std::optional<WorkerRef> prefill_worker;
  std::optional<WorkerRef> decode_worker;
  bool colocated = false;
  // Decode workers that refused a reservation or went DOWN holding one.
  std::vector<WorkerId> tried_decode_workers;
  absl::Status status;
};

class RequestStateMachine {
 public:
  explicit RequestStateMachine(const RequestStateMachineOptions& options = {});
  RequestStateMachine(const RequestStateMachine&) = delete;
  RequestStateMachine& operator=(const RequestStateMachine&) = delete;

  // Creates the request in QUEUED. AlreadyExists for a known id (terminal
  // ones included until Forget); InvalidArgument for an empty id or counts
  // out of range.
  absl::Status Admit(absl::string_view request_id, const RequestSpec& spec);

  // --- Forward edges ---------------------------------------------------------
  // Everywhere below: NotFound for an unknown id; FailedPrecondition naming
  // the current and the required state for an event the state does not
  // accept (terminal states accept none).

  // QUEUED: the decode worker is asked to reserve blocks; its lease starts
  // now (a reservation whose reply is lost still holds blocks).
  // FailedPrecondition if a reservation is already held.
  absl::StatusOr<Transition> ReserveDecode(absl::string_view request_id,
                                           const WorkerRef& decode_worker);
  // QUEUED, reserved on `decode_worker`: it refused (nothing was held). The
  // request stays QUEUED for another decode worker, or FAILS with
  // RESOURCE_EXHAUSTED after max_decode_attempts.
  absl::StatusOr<Transition> OnReserveRefused(absl::string_view request_id,
                                              const WorkerRef& decode_worker,
                                              const absl::Status& why);
  // QUEUED -> PREFILLING. With a reservation, a split request (InvalidArgument
  // if `prefill_worker` is the reserved decode worker); without one,
  // colocated: `prefill_worker` decodes too.
  absl::StatusOr<Transition> StartPrefill(absl::string_view request_id,
                                          const WorkerRef& prefill_worker);
  // PREFILLING -> TRANSFERRING (split) or -> DECODING (colocated): the first
  // token was sampled.
  absl::StatusOr<Transition> OnFirstToken(absl::string_view request_id);
  // TRANSFERRING -> DECODING: the decode worker acknowledged the last layer;
  // the prefill worker freed its copy (its lease ends, no action).
  absl::StatusOr<Transition> OnHandoff(absl::string_view request_id);
  // DECODING -> FINISHED: the Decode stream ended normally; the decode
  // worker freed the blocks (its lease ends, no action).
  absl::StatusOr<Transition> OnFinished(absl::string_view request_id);

  // --- Abort edges (any live state) -----------------------------------------
  // -> CANCELLED.
  absl::StatusOr<Transition> Cancel(absl::string_view request_id,
                                    absl::string_view reason);
  // -> FAILED (DEADLINE_EXCEEDED).
  absl::StatusOr<Transition> OnDeadline(absl::string_view request_id);
  // TRANSFERRING -> FAILED (DEADLINE_EXCEEDED naming the transfer).
  absl::StatusOr<Transition> OnTransferTimeout(absl::string_view request_id);
  // PREFILLING | TRANSFERRING | DECODING -> FAILED with `error` (a Prefill or
  // Decode RPC failed). REQUIRES: !error.ok().
  absl::StatusOr<Transition> OnPhaseFailed(absl::string_view request_id,
                                           const absl::Status& error);

  // --- Sweeps ----------------------------------------------------------------
  // OnDeadline for every live request with deadline <= now, by request id.
  std::vector<Transition> ExpireDeadlines(absl::Time now);
  // Every live request holding a lease on `worker` or an older incarnation
  // of it, by request id: a QUEUED reservation is dropped (the request stays
  // QUEUED for another decode worker, as OnReserveRefused); any other state
  // FAILS with UNAVAILABLE (retriable, with kWorkerDownPayload). Leases on the
  // dead worker end as kWorkerDown without actions; the others get actions.
  std::vector<Transition> OnWorkerDown(const WorkerRef& worker);
  // Of the request ids a worker reports holding, those it should not hold:
  // the coordinator has no live lease for them on this incarnation
  // (HeartbeatResponse.orphaned_request_ids), in the given order.
  std::vector<std::string> Orphans(
      const WorkerRef& worker,
      const std::vector<std::string>& leased_request_ids) const;

  // --- Queries ---------------------------------------------------------------
  absl::StatusOr<RequestSnapshot> Get(absl::string_view request_id) const;
  // Drops a terminal request. FailedPrecondition for a live one.
  absl::Status Forget(absl::string_view request_id);
  std::vector<Lease> LiveLeases() const;
  std::vector<Lease> LiveLeasesOn(absl::string_view worker_id) const;
  // Counts of acquired and released leases (total and by kind).
  int64_t leases_acquired() const;
  int64_t leases_released(std::optional<LeaseRelease> how = {}) const;
  // Every request's leases agree with its state (table above) and with the
  // ledger, and acquired == released + live. Internal if not, naming the
  // first request that disagrees.
  absl::Status CheckInvariants() const;

 private:
  struct Record {
    RequestSpec spec;
    RequestState state = RequestState::kQueued;
    std::optional<WorkerRef> prefill;
    std::optional<WorkerRef> decode;
    bool colocated = false;
    std::vector<WorkerId> tried_decode;
    absl::Status status;
  };

  absl::StatusOr<Record*> FindLocked(absl::string_view request_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FailedPrecondition unless `rec` is in one of `allowed`.
  absl::Status ExpectLocked(absl::string_view request_id, const Record& rec,
                            absl::string_view event,
                            std::initializer_list<RequestState> allowed) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // FindLocked, then ExpectLocked.
  absl::StatusOr<Record*> FindInStateLocked(
      absl::string_view request_id, absl::string_view event,
      std::initializer_list<RequestState> allowed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves to terminal `to`, ending every lease: workers matching `down`
  // (same id, epoch <= down's) without an action, the others with one.
  Transition TerminateLocked(absl::string_view request_id, Record& rec,
                             RequestState to, absl::Status status,
                             const std::optional<WorkerRef>& down = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the QUEUED reservation (refused or lost) and records the attempt;
  // fails the request when attempts are used up.
  Transition DropReservationLocked(absl::string_view request_id, Record& rec,
                                   LeaseRelease how, const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckRecordLocked(absl::string_view request_id,
                                 const Record& rec) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const RequestStateMachineOptions options_;
  mutable absl::Mutex mu_;
  std::map<std::string, Record, std::less<>> requests_ ABSL_GUARDED_BY(mu_);
  LeaseLedger ledger_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::coordinator

#endif  // BATON_COORDINATOR_REQUEST_STATE_MACHINE_H_
