#include "coordinator/request_state_machine.h"

#include <utility>

#include "absl/strings/cord.h"
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

namespace {

// The transition of an edge that does not end the attempt.
Transition Edge(absl::string_view request_id, absl::string_view attempt_id,
                RequestState from, RequestState to) {
  Transition t;
  t.request_id = std::string(request_id);
  t.attempt_id = std::string(attempt_id);
  t.from = from;
  t.to = to;
  return t;
}

// Whether the worker refused a ReserveKv (nothing reserved) rather than the
// call failing on the way (the worker may have reserved).
bool Refused(const absl::Status& why) {
  return why.code() == absl::StatusCode::kResourceExhausted ||
         why.code() == absl::StatusCode::kInvalidArgument ||
         why.code() == absl::StatusCode::kFailedPrecondition;
}

}  // namespace

RequestStateMachine::RequestStateMachine(
    const RequestStateMachineOptions& options)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : RealClock()) {
  BATON_CHECK_GE(options_.max_decode_attempts, 1);
  BATON_CHECK_GE(options_.max_attempts, 1);
  BATON_CHECK_GE(options_.max_migrations, 0);
  BATON_CHECK(options_.queue_timeout >= absl::ZeroDuration());
  BATON_CHECK(options_.transfer_timeout > absl::ZeroDuration());
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
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  Record rec;
  rec.spec = spec;
  rec.attempt_id = std::string(request_id);
  rec.queue_deadline = now + options_.queue_timeout;
  if (requests_.contains(request_id) || attempts_.contains(request_id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("request '", request_id, "' already exists"));
  }
  auto [it, inserted] =
      requests_.emplace(std::string(request_id), std::move(rec));
  attempts_.emplace(std::string(request_id), std::string(request_id));
  ArmLocked(it->first, it->second);
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
RequestStateMachine::FindAttemptLocked(absl::string_view attempt_id,
                                       std::string* request_id) {
  auto it = attempts_.find(attempt_id);
  if (it != attempts_.end()) {
    *request_id = it->second;
    return FindLocked(it->second);
  }
  // The attempt id of a request's first attempt is the request's.
  absl::StatusOr<Record*> found = FindLocked(attempt_id);
  if (!found.ok()) return found.status();
  return absl::FailedPreconditionError(absl::StrCat(
      "request '", attempt_id, "': attempt '", attempt_id,
      "' is over (the request is in attempt '", (*found)->attempt_id, "', ",
      RequestStateName((*found)->state), ")"));
}

absl::StatusOr<RequestStateMachine::Record*>
RequestStateMachine::FindInStateLocked(
    absl::string_view attempt_id, absl::string_view event,
    std::initializer_list<RequestState> allowed, std::string* request_id) {
  absl::StatusOr<Record*> found = FindAttemptLocked(attempt_id, request_id);
  if (!found.ok()) {
    if (absl::IsNotFound(found.status())) {
      return absl::NotFoundError(
          absl::StrCat("attempt '", attempt_id, "' is not known"));
    }
    return found.status();
  }
  if (absl::Status s = ExpectLocked(*request_id, **found, event, allowed);
      !s.ok()) {
    return s;
  }
  return found;
}

void RequestStateMachine::AddLoadLocked(const WorkerId& worker,
                                        const RequestLoad& delta) {
  if (delta == RequestLoad{}) return;
  RequestLoad& load = loads_[worker];
  load.prefill_tokens += delta.prefill_tokens;
  load.decode_blocks += delta.decode_blocks;
  load.sequences += delta.sequences;
  load.grants_in_flight += delta.grants_in_flight;
  BATON_CHECK_GE(load.prefill_tokens, 0);
  BATON_CHECK_GE(load.decode_blocks, 0);
  BATON_CHECK_GE(load.sequences, 0);
  BATON_CHECK_GE(load.grants_in_flight, 0);
  if (load == RequestLoad{}) loads_.erase(worker);
}

void RequestStateMachine::DropDecodeLoadLocked(Record& rec) {
  if (rec.decode_blocks != 0 || rec.counts_sequence || rec.grant_in_flight) {
    AddLoadLocked(rec.decode->id,
                  {.decode_blocks = -rec.decode_blocks,
                   .sequences = rec.counts_sequence ? -1 : 0,
                   .grants_in_flight = rec.grant_in_flight ? -1 : 0});
    rec.decode_blocks = 0;
    rec.counts_sequence = false;
    rec.grant_in_flight = false;
  }
}

Transition RequestStateMachine::EndLeasesLocked(
    absl::string_view request_id, Record& rec,
    const std::optional<WorkerRef>& down) {
  Transition t = Edge(request_id, rec.attempt_id, rec.state, rec.state);
  for (const Held& h :
       HeldLeases(rec.state, rec.prefill, rec.decode, rec.colocated)) {
    if (down.has_value() && Matches(h.worker, *down)) {
      ledger_.Release(h.worker, rec.attempt_id, LeaseRelease::kWorkerDown);
    } else {
      t.actions.push_back(CleanupAction{h.kind, h.worker, rec.attempt_id});
      ledger_.Release(h.worker, rec.attempt_id, LeaseRelease::kCleanupAction);
    }
  }
  if (rec.prefill_tokens != 0) {
    AddLoadLocked(rec.prefill->id, {.prefill_tokens = -rec.prefill_tokens});
    rec.prefill_tokens = 0;
  }
  DropDecodeLoadLocked(rec);
  rec.transferring_since = absl::InfiniteFuture();
  return t;
}

Transition RequestStateMachine::TerminateLocked(
    absl::string_view request_id, Record& rec, RequestState to,
    absl::Status status, const std::optional<WorkerRef>& down) {
  BATON_CHECK(IsTerminal(to));
  Transition t = EndLeasesLocked(request_id, rec, down);
  t.to = to;
  t.status = status;
  rec.state = to;
  rec.status = std::move(status);
  return t;
}

Transition RequestStateMachine::DropReservationLocked(
    absl::string_view request_id, Record& rec, LeaseRelease how,
    const absl::Status& why) {
  BATON_CHECK(rec.state == RequestState::kQueued && rec.decode.has_value());
  Transition t = Edge(request_id, rec.attempt_id, RequestState::kQueued,
                      RequestState::kQueued);
  if (how == LeaseRelease::kCleanupAction) {
    t.actions.push_back(FreeKv(*rec.decode, rec.attempt_id));
  }
  ledger_.Release(*rec.decode, rec.attempt_id, how);
  DropDecodeLoadLocked(rec);
  rec.tried_decode.push_back(rec.decode->id);
  rec.decode.reset();
  if (static_cast<int>(rec.tried_decode.size()) <
      options_.max_decode_attempts) {
    ArmLocked(request_id, rec);  // the queue timer runs again
    return t;
  }
  Transition failed = TerminateLocked(
      request_id, rec, RequestState::kFailed,
      absl::ResourceExhaustedError(absl::StrCat(
          "request '", request_id, "': no decode worker took it after ",
          rec.tried_decode.size(), " attempts (",
          absl::StrJoin(rec.tried_decode, ", "), "); last: ", why.message())));
  failed.from = RequestState::kQueued;
  failed.actions = std::move(t.actions);
  return failed;
}

absl::StatusOr<Transition> RequestStateMachine::ReserveDecode(
    absl::string_view attempt_id, const WorkerRef& decode_worker,
    int64_t blocks, bool waits) {
  if (blocks < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attempt '", attempt_id, "': blocks must be >= 0, got ", blocks));
  }
  absl::MutexLock lock(&mu_);
  std::string request_id;
  absl::StatusOr<Record*> found = FindInStateLocked(
      attempt_id, "ReserveDecode", {RequestState::kQueued}, &request_id);
  if (!found.ok()) return found.status();
  Record* rec = *found;
  if (rec->decode.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("request '", request_id, "': ReserveDecode on ",
                     WorkerRefString(decode_worker), " while a reservation on ",
                     WorkerRefString(*rec->decode), " is held"));
  }
  ledger_.Acquire(decode_worker, rec->attempt_id);
  rec->decode = decode_worker;
  rec->decode_blocks = blocks;
  rec->counts_sequence = true;
  rec->grant_in_flight = !waits;
  AddLoadLocked(decode_worker.id, {.decode_blocks = blocks,
                                   .sequences = 1,
                                   .grants_in_flight = waits ? 0 : 1});
  return Edge(request_id, rec->attempt_id, RequestState::kQueued,
              RequestState::kQueued);
}

absl::StatusOr<Transition> RequestStateMachine::OnReserveRefused(
    absl::string_view attempt_id, const WorkerRef& decode_worker,
    const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  std::string request_id;
  absl::StatusOr<Record*> found = FindInStateLocked(
      attempt_id, "OnReserveRefused", {RequestState::kQueued}, &request_id);
  if (!found.ok()) return found.status();
  Record& rec = **found;
  if (!rec.decode.has_value() || !(*rec.decode == decode_worker)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request '", request_id, "': OnReserveRefused from ",
        WorkerRefString(decode_worker), " which holds no reservation for it"));
  }
  return DropReservationLocked(
      request_id, rec,
      Refused(why) ? LeaseRelease::kRefused : LeaseRelease::kCleanupAction,
      why);
}

absl::Status RequestStateMachine::OnReserved(absl::string_view attempt_id) {
  absl::MutexLock lock(&mu_);
  std::string request_id;
  absl::StatusOr<Record*> found = FindAttemptLocked(attempt_id, &request_id);
  if (!found.ok()) return found.status();
  Record& rec = **found;
  if (IsTerminal(rec.state) || !rec.decode.has_value() || rec.colocated) {
    return absl::FailedPreconditionError(
        absl::StrCat("request '", request_id, "': OnReserved in ",
                     RequestStateName(rec.state), " holds no reservation"));
  }
  if (rec.grant_in_flight) {
    rec.grant_in_flight = false;
    AddLoadLocked(rec.decode->id, {.grants_in_flight = -1});
  }
  return absl::OkStatus();
}

absl::StatusOr<Transition> RequestStateMachine::StartPrefill(
    absl::string_view attempt_id, const WorkerRef& prefill_worker, bool split,
    int64_t blocks) {
  absl::MutexLock lock(&mu_);
  std::string request_id;
  absl::StatusOr<Record*> found = FindInStateLocked(
      attempt_id, "StartPrefill", {RequestState::kQueued}, &request_id);
  if (!found.ok()) return found.status();
  Record& rec = **found;
  if (split && !rec.decode.has_value()) {
    if (rec.tried_decode.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("request '", request_id,
                       "': StartPrefill of a split attempt without a decode "
                       "reservation"));
    }
    const std::string& lost = rec.tried_decode.back();
    absl::Status down = absl::UnavailableError(
        absl::StrCat("request '", request_id, "': its decode reservation on ",
                     lost, " was dropped before the prefill started"));
    down.SetPayload(kWorkerDownPayload, absl::Cord(lost));
    return down;
  }
  if (rec.decode.has_value() && rec.decode->id == prefill_worker.id) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request '", request_id, "': prefill worker ",
        WorkerRefString(prefill_worker),
        " is also its reserved decode worker; serve it colocated instead"));
  }
  ledger_.Acquire(prefill_worker, rec.attempt_id);
  rec.prefill = prefill_worker;
  rec.prefill_tokens = rec.spec.prompt_tokens;
  const bool colocated = !rec.decode.has_value();
  if (!colocated) blocks = 0;
  AddLoadLocked(prefill_worker.id, {.prefill_tokens = rec.prefill_tokens,
                                    .decode_blocks = blocks,
                                    .sequences = colocated ? 1 : 0});
  if (colocated) {
    rec.colocated = true;
    rec.decode = prefill_worker;
    rec.decode_blocks = blocks;
    rec.counts_sequence = true;
  }
  rec.state = RequestState::kPrefilling;
  return Edge(request_id, rec.attempt_id, RequestState::kQueued,
              RequestState::kPrefilling);
}

absl::StatusOr<Transition> RequestStateMachine::OnFirstToken(
    absl::string_view attempt_id) {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  std::string request_id;
  absl::StatusOr<Record*> found = FindInStateLocked(
      attempt_id, "OnFirstToken", {RequestState::kPrefilling}, &request_id);
  if (!found.ok()) return found.status();
  Record& rec = **found;
  AddLoadLocked(rec.prefill->id, {.prefill_tokens = -rec.prefill_tokens});
  rec.prefill_tokens = 0;
  rec.first_token = true;
  // Colocated: the same lease now backs the decode.
  rec.state =
      rec.colocated ? RequestState::kDecoding : RequestState::kTransferring;
  if (!rec.colocated) {
    rec.transferring_since = now;
    ArmLocked(request_id, rec);
  }
  return Edge(request_id, rec.attempt_id, RequestState::kPrefilling, rec.state);
}

absl::StatusOr<Transition> RequestStateMachine::OnHandoff(
    absl::string_view attempt_id) {
  absl::MutexLock lock(&mu_);
  std::string request_id;
  absl::StatusOr<Record*> found = FindInStateLocked(
      attempt_id, "OnHandoff", {RequestState::kTransferring}, &request_id);
  if (!found.ok()) return found.status();
  Record& rec = **found;
  ledger_.Release(*rec.prefill, rec.attempt_id, LeaseRelease::kWorkerFreed);
  rec.state = RequestState::kDecoding;
  rec.transferring_since = absl::InfiniteFuture();
  return Edge(request_id, rec.attempt_id, RequestState::kTransferring,
              RequestState::kDecoding);
}

absl::StatusOr<Transition> RequestStateMachine::OnFinished(
    absl::string_view attempt_id) {
  absl::MutexLock lock(&mu_);
  std::string request_id;
  absl::StatusOr<Record*> found = FindInStateLocked(
      attempt_id, "OnFinished", {RequestState::kDecoding}, &request_id);
  if (!found.ok()) return found.status();
  Record& rec = **found;
  ledger_.Release(*rec.decode, rec.attempt_id, LeaseRelease::kWorkerFreed);
  DropDecodeLoadLocked(rec);
  rec.state = RequestState::kFinished;
  return Edge(request_id, rec.attempt_id, RequestState::kDecoding,
              RequestState::kFinished);
}

}  // namespace baton::coordinator
