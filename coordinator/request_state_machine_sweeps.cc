// The state machine's sweeps: timers, dead workers and orphaned leases.
#include <algorithm>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "coordinator/request_leases.h"
#include "coordinator/request_state_machine.h"

namespace baton::coordinator {

using internal::Held;
using internal::HeldLeases;
using internal::Matches;

namespace {

// The heap's order: the earliest due time on top.
template <typename T>
bool Later(const T& a, const T& b) {
  return a.due > b.due;
}

}  // namespace

absl::Time RequestStateMachine::DueLocked(const Record& rec) const {
  if (IsTerminal(rec.state)) return absl::InfiniteFuture();
  absl::Time due = rec.spec.deadline;
  if (rec.state == RequestState::kTransferring) {
    due = std::min(due, rec.transferring_since + options_.transfer_timeout);
  }
  if (rec.state == RequestState::kQueued && !rec.decode.has_value()) {
    due = std::min(due, rec.queue_deadline);
  }
  return due;
}

void RequestStateMachine::ArmLocked(absl::string_view request_id, Record& rec) {
  const absl::Time due = DueLocked(rec);
  if (due == absl::InfiniteFuture() || due >= rec.armed) return;
  rec.armed = due;
  timers_.push_back(Timer{due, std::string(request_id)});
  std::push_heap(timers_.begin(), timers_.end(), Later<Timer>);
}

std::vector<Transition> RequestStateMachine::ExpireDeadlines(absl::Time now) {
  absl::MutexLock lock(&mu_);
  // Every timer due by now leaves the heap; its records are then looked at
  // in request id order, each once.
  std::vector<std::string> due;
  while (!timers_.empty() && timers_.front().due <= now) {
    std::pop_heap(timers_.begin(), timers_.end(), Later<Timer>);
    due.push_back(std::move(timers_.back().request_id));
    timers_.pop_back();
  }
  std::sort(due.begin(), due.end());
  due.erase(std::unique(due.begin(), due.end()), due.end());
  std::vector<Transition> out;
  for (const std::string& id : due) {
    auto it = requests_.find(id);
    if (it == requests_.end() || IsTerminal(it->second.state)) continue;
    Record& rec = it->second;
    // Its armed timer, if due, was among those just taken out.
    if (rec.armed <= now) rec.armed = absl::InfiniteFuture();
    if (rec.spec.deadline <= now) {
      out.push_back(
          TerminateLocked(id, rec, RequestState::kFailed,
                          absl::DeadlineExceededError(absl::StrCat(
                              "request '", id, "': deadline expired in ",
                              RequestStateName(rec.state)))));
    } else if (rec.state == RequestState::kTransferring &&
               now - rec.transferring_since >= options_.transfer_timeout) {
      out.push_back(TerminateLocked(
          id, rec, RequestState::kFailed,
          absl::DeadlineExceededError(
              absl::StrCat("request '", id, "': KV transfer from ",
                           WorkerRefString(*rec.prefill), " to ",
                           WorkerRefString(*rec.decode), " timed out after ",
                           absl::FormatDuration(options_.transfer_timeout)))));
    } else if (rec.state == RequestState::kQueued && !rec.decode.has_value() &&
               rec.queue_deadline <= now) {
      out.push_back(TerminateLocked(
          id, rec, RequestState::kFailed,
          absl::ResourceExhaustedError(absl::StrCat(
              QueueTimeoutMessage(options_.queue_timeout), " (request '", id,
              "', attempt ", rec.attempt, ")"))));
    } else {
      ArmLocked(id, rec);
    }
  }
  return out;
}

std::vector<Transition> RequestStateMachine::OnWorkerDown(
    const WorkerRef& worker) {
  absl::MutexLock lock(&mu_);
  std::vector<Transition> out;
  for (auto& [id, rec] : requests_) {
    bool involved = false;
    for (const Held& h :
         HeldLeases(rec.state, rec.prefill, rec.decode, rec.colocated)) {
      involved = involved || Matches(h.worker, worker);
    }
    if (!involved) continue;
    absl::Status down = absl::UnavailableError(absl::StrCat(
        "request '", id, "': worker ", WorkerRefString(worker),
        " went down in ", RequestStateName(rec.state), "; retry the request"));
    down.SetPayload(kWorkerDownPayload, absl::Cord(worker.id));
    if (rec.state == RequestState::kQueued) {
      out.push_back(
          DropReservationLocked(id, rec, LeaseRelease::kWorkerDown, down));
    } else {
      out.push_back(FailAttemptLocked(id, rec, down, worker));
    }
  }
  return out;
}

std::vector<std::string> RequestStateMachine::Orphans(
    const WorkerRef& worker,
    const std::vector<std::string>& leased_request_ids) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const std::string& id : leased_request_ids) {
    if (!ledger_.Holds(worker, id)) out.push_back(id);
  }
  return out;
}

}  // namespace baton::coordinator
