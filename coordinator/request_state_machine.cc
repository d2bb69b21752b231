#include "coordinator/request_state_machine.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "coordinator/request_leases.h"

namespace baton::coordinator {

using internal::Held;
using internal::HeldLeases;
using internal::Matches;

absl::string_view RequestStateName(RequestState state) {
  switch (state) {
    case RequestState::kQueued:
      return "QUEUED";
    case RequestState::kPrefilling:
      return "PREFILLING";
    case RequestState::kTransferring:
      return "TRANSFERRING";
    case RequestState::kDecoding:
      return "DECODING";
    case RequestState::kFinished:
      return "FINISHED";
    case RequestState::kCancelled:
      return "CANCELLED";
    case RequestState::kFailed:
      return "FAILED";
  }
  return "UNKNOWN";
}

bool IsTerminal(RequestState state) {
  return state == RequestState::kFinished ||
         state == RequestState::kCancelled || state == RequestState::kFailed;
}

CleanupAction FreeKv(WorkerRef worker, absl::string_view request_id) {
  return CleanupAction{CleanupAction::Kind::kFreeKv, std::move(worker),
                       std::string(request_id)};
}

CleanupAction CancelOnWorker(WorkerRef worker, absl::string_view request_id) {
  return CleanupAction{CleanupAction::Kind::kCancelOnWorker, std::move(worker),
                       std::string(request_id)};
}

std::ostream& operator<<(std::ostream& os, const CleanupAction& action) {
  return os << (action.kind == CleanupAction::Kind::kFreeKv ? "FreeKv{"
                                                            : "CancelOnWorker{")
            << action.worker << ", " << action.request_id << "}";
}

RequestStateMachine::RequestStateMachine(
    const RequestStateMachineOptions& options)
    : options_(options) {
  BATON_CHECK_GE(options_.max_decode_attempts, 1);
}

absl::Status RequestStateMachine::Admit(absl::string_view request_id,
                                        const RequestSpec& spec) {
  if (request_id.empty()) {
    return absl::InvalidArgumentError("request_id is empty");
  }
  if (spec.prompt_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request '", request_id, "': prompt_tokens must be >= 1, got ",
        spec.prompt_tokens));
  }
  if (spec.max_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("request '", request_id,
                     "': max_tokens must be >= 0, got ", spec.max_tokens));
  }
  absl::MutexLock lock(&mu_);
  Record rec;
  rec.spec = spec;
  if (!requests_.emplace(std::string(request_id), std::move(rec)).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("request '", request_id, "' already exists"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RequestStateMachine::Record*> RequestStateMachine::FindLocked(
    absl::string_view request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    return absl::NotFoundError(
        absl::StrCat("request '", request_id, "' is not known"));
  }
  return &it->second;
}

absl::Status RequestStateMachine::ExpectLocked(
    absl::string_view request_id, const Record& rec, absl::string_view event,
    std::initializer_list<RequestState> allowed) const {
  for (RequestState s : allowed) {
    if (rec.state == s) return absl::OkStatus();
  }
  std::vector<absl::string_view> names;
  for (RequestState s : allowed) names.push_back(RequestStateName(s));
  return absl::FailedPreconditionError(
      absl::StrCat("request '", request_id, "': ", event,
                   " is invalid in state ", RequestStateName(rec.state),
                   " (allowed in ", absl::StrJoin(names, ", "), ")"));
}

absl::StatusOr<RequestStateMachine::Record*>
RequestStateMachine::FindInStateLocked(
    absl::string_view request_id, absl::string_view event,
    std::initializer_list<RequestState> allowed) {
  absl::StatusOr<Record*> found = FindLocked(request_id);
  if (!found.ok()) return found.status();
  if (absl::Status s = ExpectLocked(request_id, **found, event, allowed);
      !s.ok()) {
    return s;
  }
  return found;
}

Transition RequestStateMachine::TerminateLocked(
    absl::string_view request_id, Record& rec, RequestState to,
    absl::Status status, const std::optional<WorkerRef>& down) {
  BATON_CHECK(IsTerminal(to));
  Transition t{std::string(request_id), rec.state, to, {}, status};
  for (const Held& h :
       HeldLeases(rec.state, rec.prefill, rec.decode, rec.colocated)) {
    if (down.has_value() && Matches(h.worker, *down)) {
      ledger_.Release(h.worker, request_id, LeaseRelease::kWorkerDown);
    } else {
      t.actions.push_back(CleanupAction{h.kind, h.worker, t.request_id});
      ledger_.Release(h.worker, request_id, LeaseRelease::kCleanupAction);
    }
  }
  rec.state = to;
  rec.status = std::move(status);
  return t;
}

Transition RequestStateMachine::DropReservationLocked(
    absl::string_view request_id, Record& rec, LeaseRelease how,
    const absl::Status& why) {
  BATON_CHECK(rec.state == RequestState::kQueued && rec.decode.has_value());
  ledger_.Release(*rec.decode, request_id, how);
  rec.tried_decode.push_back(rec.decode->id);
  rec.decode.reset();
  if (static_cast<int>(rec.tried_decode.size()) <
      options_.max_decode_attempts) {
    return Transition{std::string(request_id),
                      RequestState::kQueued,
                      RequestState::kQueued,
                      {},
                      absl::OkStatus()};
  }
  return TerminateLocked(
      request_id, rec, RequestState::kFailed,
      absl::ResourceExhaustedError(absl::StrCat(
          "request '", request_id, "': no decode worker took it after ",
          rec.tried_decode.size(), " attempts (",
          absl::StrJoin(rec.tried_decode, ", "), "); last: ", why.message())));
}

absl::StatusOr<Transition> RequestStateMachine::ReserveDecode(
    absl::string_view request_id, const WorkerRef& decode_worker) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Record*> found =
      FindInStateLocked(request_id, "ReserveDecode", {RequestState::kQueued});
  if (!found.ok()) return found.status();
  Record* rec = *found;
  if (rec->decode.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("request '", request_id, "': ReserveDecode on ",
                     WorkerRefString(decode_worker), " while a reservation on ",
                     WorkerRefString(*rec->decode), " is held"));
  }
  ledger_.Acquire(decode_worker, request_id);
  rec->decode = decode_worker;
  return Transition{std::string(request_id),
                    RequestState::kQueued,
                    RequestState::kQueued,
                    {},
                    absl::OkStatus()};
}

absl::StatusOr<Transition> RequestStateMachine::OnReserveRefused(
    absl::string_view request_id, const WorkerRef& decode_worker,
    const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Record*> found = FindInStateLocked(
      request_id, "OnReserveRefused", {RequestState::kQueued});
  if (!found.ok()) return found.status();
  Record& rec = **found;
  if (!rec.decode.has_value() || !(*rec.decode == decode_worker)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request '", request_id, "': OnReserveRefused from ",
        WorkerRefString(decode_worker), " which holds no reservation for it"));
  }
  return DropReservationLocked(request_id, rec, LeaseRelease::kRefused, why);
}

absl::StatusOr<Transition> RequestStateMachine::StartPrefill(
    absl::string_view request_id, const WorkerRef& prefill_worker) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Record*> found =
      FindInStateLocked(request_id, "StartPrefill", {RequestState::kQueued});
  if (!found.ok()) return found.status();
  Record& rec = **found;
  if (rec.decode.has_value() && rec.decode->id == prefill_worker.id) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request '", request_id, "': prefill worker ",
        WorkerRefString(prefill_worker),
        " is also its reserved decode worker; serve it colocated instead"));
  }
  ledger_.Acquire(prefill_worker, request_id);
  rec.prefill = prefill_worker;
  if (!rec.decode.has_value()) {
    rec.colocated = true;
    rec.decode = prefill_worker;
  }
  rec.state = RequestState::kPrefilling;
  return Transition{std::string(request_id),
                    RequestState::kQueued,
                    RequestState::kPrefilling,
                    {},
                    absl::OkStatus()};
}

absl::StatusOr<Transition> RequestStateMachine::OnFirstToken(
    absl::string_view request_id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Record*> found = FindInStateLocked(
      request_id, "OnFirstToken", {RequestState::kPrefilling});
  if (!found.ok()) return found.status();
  Record& rec = **found;
  // Colocated: the same lease now backs the decode.
  rec.state =
      rec.colocated ? RequestState::kDecoding : RequestState::kTransferring;
  return Transition{std::string(request_id),
                    RequestState::kPrefilling,
                    rec.state,
                    {},
                    absl::OkStatus()};
}

absl::StatusOr<Transition> RequestStateMachine::OnHandoff(
    absl::string_view request_id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Record*> found =
      FindInStateLocked(request_id, "OnHandoff", {RequestState::kTransferring});
  if (!found.ok()) return found.status();
  Record& rec = **found;
  ledger_.Release(*rec.prefill, request_id, LeaseRelease::kWorkerFreed);
  rec.state = RequestState::kDecoding;
  return Transition{std::string(request_id),
                    RequestState::kTransferring,
                    RequestState::kDecoding,
                    {},
                    absl::OkStatus()};
}

absl::StatusOr<Transition> RequestStateMachine::OnFinished(
    absl::string_view request_id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Record*> found =
      FindInStateLocked(request_id, "OnFinished", {RequestState::kDecoding});
  if (!found.ok()) return found.status();
  Record& rec = **found;
  ledger_.Release(*rec.decode, request_id, LeaseRelease::kWorkerFreed);
  rec.state = RequestState::kFinished;
  return Transition{std::string(request_id),
                    RequestState::kDecoding,
                    RequestState::kFinished,
                    {},
                    absl::OkStatus()};
}

absl::StatusOr<Transition> RequestStateMachine::Cancel(
    absl::string_view request_id, absl::string_view reason) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Record*> found = FindLocked(request_id);
  if (!found.ok()) return found.status();
  Record& rec = **found;
  if (absl::Status s =
          ExpectLocked(request_id, rec, "Cancel",
                       {RequestState::kQueued, RequestState::kPrefilling,
                        RequestState::kTransferring, RequestState::kDecoding});
      !s.ok()) {
    return s;
  }
  return TerminateLocked(
      request_id, rec, RequestState::kCancelled,
      absl::CancelledError(
          absl::StrCat("request '", request_id, "' cancelled: ", reason)));
}

absl::StatusOr<Transition> RequestStateMachine::OnDeadline(
    absl::string_view request_id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Record*> found = FindLocked(request_id);
  if (!found.ok()) return found.status();
  Record& rec = **found;
  if (absl::Status s =
          ExpectLocked(request_id, rec, "OnDeadline",
                       {RequestState::kQueued, RequestState::kPrefilling,
                        RequestState::kTransferring, RequestState::kDecoding});
      !s.ok()) {
    return s;
  }
  return TerminateLocked(request_id, rec, RequestState::kFailed,
                         absl::DeadlineExceededError(absl::StrCat(
                             "request '", request_id, "': deadline expired in ",
                             RequestStateName(rec.state))));
}

absl::StatusOr<Transition> RequestStateMachine::OnTransferTimeout(
    absl::string_view request_id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Record*> found = FindInStateLocked(
      request_id, "OnTransferTimeout", {RequestState::kTransferring});
  if (!found.ok()) return found.status();
  Record& rec = **found;
  return TerminateLocked(request_id, rec, RequestState::kFailed,
                         absl::DeadlineExceededError(absl::StrCat(
                             "request '", request_id, "': KV transfer from ",
                             WorkerRefString(*rec.prefill), " to ",
                             WorkerRefString(*rec.decode), " timed out")));
}

absl::StatusOr<Transition> RequestStateMachine::OnPhaseFailed(
    absl::string_view request_id, const absl::Status& error) {
  BATON_CHECK(!error.ok());
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Record*> found = FindLocked(request_id);
  if (!found.ok()) return found.status();
  Record& rec = **found;
  if (absl::Status s =
          ExpectLocked(request_id, rec, "OnPhaseFailed",
                       {RequestState::kPrefilling, RequestState::kTransferring,
                        RequestState::kDecoding});
      !s.ok()) {
    return s;
  }
  return TerminateLocked(request_id, rec, RequestState::kFailed, error);
}

absl::StatusOr<RequestSnapshot> RequestStateMachine::Get(
    absl::string_view request_id) const {
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    return absl::NotFoundError(
        absl::StrCat("request '", request_id, "' is not known"));
  }
  const Record& rec = it->second;
  return RequestSnapshot{rec.state,     rec.prefill,      rec.decode,
                         rec.colocated, rec.tried_decode, rec.status};
}

absl::Status RequestStateMachine::Forget(absl::string_view request_id) {
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    return absl::NotFoundError(
        absl::StrCat("request '", request_id, "' is not known"));
  }
  if (!IsTerminal(it->second.state)) {
    return absl::FailedPreconditionError(
        absl::StrCat("request '", request_id, "' is live (",
                     RequestStateName(it->second.state), ")"));
  }
  requests_.erase(it);
  return absl::OkStatus();
}

std::vector<Lease> RequestStateMachine::LiveLeases() const {
  absl::MutexLock lock(&mu_);
  return ledger_.Live();
}

std::vector<Lease> RequestStateMachine::LiveLeasesOn(
    absl::string_view worker_id) const {
  absl::MutexLock lock(&mu_);
  return ledger_.LiveOn(worker_id);
}

int64_t RequestStateMachine::leases_acquired() const {
  absl::MutexLock lock(&mu_);
  return ledger_.acquired();
}

int64_t RequestStateMachine::leases_released(
    std::optional<LeaseRelease> how) const {
  absl::MutexLock lock(&mu_);
  return how.has_value() ? ledger_.released(*how) : ledger_.released();
}

absl::Status RequestStateMachine::CheckRecordLocked(
    absl::string_view request_id, const Record& rec) const {
  for (const Held& h :
       HeldLeases(rec.state, rec.prefill, rec.decode, rec.colocated)) {
    if (!ledger_.Holds(h.worker, request_id)) {
      return absl::InternalError(
          absl::StrCat("request '", request_id, "' in ",
                       RequestStateName(rec.state), " should hold a lease on ",
                       WorkerRefString(h.worker), " but the ledger has none"));
    }
  }
  return absl::OkStatus();
}

absl::Status RequestStateMachine::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  int64_t expected_live = 0;
  for (const auto& [id, rec] : requests_) {
    if (absl::Status s = CheckRecordLocked(id, rec); !s.ok()) return s;
    expected_live += static_cast<int64_t>(
        HeldLeases(rec.state, rec.prefill, rec.decode, rec.colocated).size());
  }
  if (ledger_.live() != expected_live) {
    return absl::InternalError(absl::StrCat(
        "ledger has ", ledger_.live(),
        " live leases but the requests' states account for ", expected_live));
  }
  if (ledger_.acquired() != ledger_.released() + ledger_.live()) {
    return absl::InternalError(
        absl::StrCat("leases acquired ", ledger_.acquired(), " != released ",
                     ledger_.released(), " + live ", ledger_.live()));
  }
  return absl::OkStatus();
}

}  // namespace baton::coordinator
