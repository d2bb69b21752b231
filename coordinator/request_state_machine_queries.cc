// The state machine's queries: snapshots, leases, loads and the invariant
// check.
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/request_leases.h"
#include "coordinator/request_state_machine.h"

namespace baton::coordinator {

using internal::Held;
using internal::HeldLeases;

absl::StatusOr<RequestSnapshot> RequestStateMachine::Get(
    absl::string_view request_id) const {
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    return absl::NotFoundError(
        absl::StrCat("request '", request_id, "' is not known"));
  }
  const Record& rec = it->second;
  RequestSnapshot snap;
  snap.state = rec.state;
  snap.attempt_id = rec.attempt_id;
  snap.attempt = rec.attempt;
  snap.migrations = rec.migrations;
  snap.first_token = rec.first_token;
  snap.prefill_worker = rec.prefill;
  snap.decode_worker = rec.decode;
  snap.colocated = rec.colocated;
  snap.tried_decode_workers = rec.tried_decode;
  snap.excluded_prefill = rec.excluded_prefill;
  snap.excluded_decode = rec.excluded_decode;
  snap.queue_deadline = rec.queue_deadline;
  snap.status = rec.status;
  return snap;
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
  attempts_.erase(it->second.attempt_id);
  requests_.erase(it);
  return absl::OkStatus();
}

std::map<WorkerId, RequestLoad> RequestStateMachine::Loads() const {
  absl::MutexLock lock(&mu_);
  return loads_;
}

void RequestStateMachine::VisitLoads(
    absl::FunctionRef<void(const WorkerId&, const RequestLoad&)> visit) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [worker, load] : loads_) visit(worker, load);
}

RequestLoad RequestStateMachine::LoadOn(const WorkerId& worker) const {
  absl::MutexLock lock(&mu_);
  auto it = loads_.find(worker);
  return it == loads_.end() ? RequestLoad{} : it->second;
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

int64_t RequestStateMachine::pending_timers() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(timers_.size());
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
    if (!ledger_.Holds(h.worker, rec.attempt_id)) {
      return absl::InternalError(
          absl::StrCat("request '", request_id, "' in ",
                       RequestStateName(rec.state), " should hold a lease on ",
                       WorkerRefString(h.worker), " but the ledger has none"));
    }
  }
  if (!IsTerminal(rec.state) && rec.armed > DueLocked(rec)) {
    return absl::InternalError(absl::StrCat(
        "request '", request_id, "' in ", RequestStateName(rec.state),
        " has a timer due at ", absl::FormatTime(DueLocked(rec)),
        " that no sweep would look at (earliest armed: ",
        absl::FormatTime(rec.armed), ")"));
  }
  return absl::OkStatus();
}

absl::Status RequestStateMachine::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  int64_t expected_live = 0;
  std::map<WorkerId, RequestLoad> loads;
  for (const auto& [id, rec] : requests_) {
    if (absl::Status s = CheckRecordLocked(id, rec); !s.ok()) return s;
    expected_live += static_cast<int64_t>(
        HeldLeases(rec.state, rec.prefill, rec.decode, rec.colocated).size());
    if (rec.prefill_tokens != 0) {
      loads[rec.prefill->id].prefill_tokens += rec.prefill_tokens;
    }
    if (rec.decode_blocks != 0) {
      loads[rec.decode->id].decode_blocks += rec.decode_blocks;
    }
    if (rec.counts_sequence) ++loads[rec.decode->id].sequences;
    if (rec.grant_in_flight) ++loads[rec.decode->id].grants_in_flight;
    if (IsTerminal(rec.state) &&
        (rec.prefill_tokens != 0 || rec.decode_blocks != 0 ||
         rec.counts_sequence || rec.grant_in_flight)) {
      return absl::InternalError(
          absl::StrCat("request '", id, "' is ", RequestStateName(rec.state),
                       " but still counts load on a worker"));
    }
  }
  if (loads != loads_) {
    return absl::InternalError(
        "the workers' load differs from the sum of the requests' loads");
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
