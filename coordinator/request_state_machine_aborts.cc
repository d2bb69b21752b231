// The state machine's edges that end an attempt: the retry decision
// (OnAttemptFailed, OnWorkerDown), client cancel, deadline and transfer
// timeout.
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "coordinator/request_state_machine.h"

namespace baton::coordinator {

std::string QueueTimeoutMessage(absl::Duration queue_timeout) {
  return absl::StrCat("no worker had room for the request within ",
                      absl::FormatDuration(queue_timeout));
}

Transition RequestStateMachine::FailAttemptLocked(
    absl::string_view request_id, Record& rec, const absl::Status& error,
    const std::optional<WorkerRef>& down) {
  BATON_CHECK(!error.ok());
  // Which worker incarnations failed the attempt, from the typed payloads.
  std::vector<WorkerRef> failed_prefill;
  std::vector<WorkerRef> failed_decode;
  bool retriable = false;
  if (error.code() == absl::StatusCode::kDataLoss &&
      (FromWorkerRpc(error, WorkerRpc::kPrefillHandoff) ||
       FromWorkerRpc(error, WorkerRpc::kDecode))) {
    // The KV bytes arrived corrupted (a checksum mismatch): the next
    // attempt computes and moves them again. Neither worker is excluded
    // (the bytes failed, not a worker); the budget bounds a link that
    // corrupts every time.
    retriable = true;
  } else if (FromWorkerRpc(error, WorkerRpc::kReserveKvBesidePrefill) &&
             (error.code() == absl::StatusCode::kResourceExhausted ||
              error.code() == absl::StatusCode::kUnavailable ||
              error.code() == absl::StatusCode::kDeadlineExceeded) &&
             rec.decode.has_value() && !rec.colocated &&
             (rec.state == RequestState::kPrefilling ||
              rec.state == RequestState::kTransferring)) {
    // A reservation made beside the Prefill (overlap_reserve_kv) was
    // refused or its reply lost: the next attempt reserves first, where a
    // refusal waits in a worker's line or goes elsewhere. No worker is
    // excluded (a full pool is not a broken worker; a dead one is DOWN).
    retriable = true;
  } else if (FromWorkerRpc(error, WorkerRpc::kSetKvTarget) &&
             error.code() == absl::StatusCode::kDeadlineExceeded &&
             rec.prefill.has_value()) {
    // The prefill worker did not take the reservation's target within the
    // worker RPC timeout (stalled, or frozen on its way out): the next
    // attempt goes elsewhere, as after one that is gone. (Past the
    // request's own deadline the sweep ends it.)
    retriable = true;
    failed_prefill.push_back(*rec.prefill);
  } else if (error.code() == absl::StatusCode::kUnavailable) {
    const bool split = !rec.colocated && rec.decode.has_value();
    if (const auto who = error.GetPayload(kWorkerDownPayload)) {
      retriable = true;
      if (rec.prefill.has_value() && *who == rec.prefill->id) {
        failed_prefill.push_back(*rec.prefill);
      }
      if (split && *who == rec.decode->id) failed_decode.push_back(*rec.decode);
    } else if ((FromWorkerRpc(error, WorkerRpc::kPrefill) ||
                FromWorkerRpc(error, WorkerRpc::kSetKvTarget)) &&
               rec.prefill.has_value()) {
      // The prefill worker failed its Prefill, or the target sent after it
      // (it is gone, or going): the next attempt goes elsewhere.
      retriable = true;
      failed_prefill.push_back(*rec.prefill);
    } else if (FromWorkerRpc(error, WorkerRpc::kDecode) &&
               rec.decode.has_value()) {
      retriable = true;
      (split ? failed_decode : failed_prefill).push_back(*rec.decode);
    } else if (FromWorkerRpc(error, WorkerRpc::kPrefillHandoff)) {
      // Either side of the handoff may have failed: exclude neither (a
      // dead one fails its next RPC at once, or is DOWN by then).
      retriable = true;
    }
  }
  const bool can_migrate = rec.migrations < options_.max_migrations;
  const bool again =
      retriable &&
      (rec.first_token ? can_migrate : rec.attempt < options_.max_attempts);
  if (!again) {
    return TerminateLocked(request_id, rec,
                           error.code() == absl::StatusCode::kCancelled
                               ? RequestState::kCancelled
                               : RequestState::kFailed,
                           error, down);
  }
  Transition t = EndLeasesLocked(request_id, rec, down);
  t.to = RequestState::kQueued;
  t.status = error;
  t.new_attempt = true;
  t.migration = rec.first_token;
  rec.excluded_prefill.insert(rec.excluded_prefill.end(),
                              failed_prefill.begin(), failed_prefill.end());
  rec.excluded_decode.insert(rec.excluded_decode.end(), failed_decode.begin(),
                             failed_decode.end());
  ++rec.attempt;
  attempts_.erase(rec.attempt_id);
  if (rec.first_token) {
    ++rec.migrations;
    rec.attempt_id = absl::StrCat(request_id, "/migrate", rec.migrations);
  } else {
    rec.attempt_id = absl::StrCat(request_id, "/retry", rec.attempt - 1);
  }
  // Unique among requests and attempts, even against a request id that
  // happens to look like an attempt's.
  for (int n = 2;
       requests_.contains(rec.attempt_id) || attempts_.contains(rec.attempt_id);
       ++n) {
    rec.attempt_id = absl::StrCat(rec.attempt_id, "~", n);
  }
  attempts_.emplace(rec.attempt_id, std::string(request_id));
  rec.state = RequestState::kQueued;
  rec.prefill.reset();
  rec.decode.reset();
  rec.colocated = false;
  rec.tried_decode.clear();
  rec.queue_deadline = clock_->Now() + options_.queue_timeout;
  ArmLocked(request_id, rec);
  return t;
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
    absl::string_view attempt_id) {
  absl::MutexLock lock(&mu_);
  std::string request_id;
  absl::StatusOr<Record*> found =
      FindInStateLocked(attempt_id, "OnTransferTimeout",
                        {RequestState::kTransferring}, &request_id);
  if (!found.ok()) return found.status();
  Record& rec = **found;
  return TerminateLocked(request_id, rec, RequestState::kFailed,
                         absl::DeadlineExceededError(absl::StrCat(
                             "request '", request_id, "': KV transfer from ",
                             WorkerRefString(*rec.prefill), " to ",
                             WorkerRefString(*rec.decode), " timed out")));
}

absl::StatusOr<Transition> RequestStateMachine::OnAttemptFailed(
    absl::string_view attempt_id, const absl::Status& error) {
  BATON_CHECK(!error.ok());
  absl::MutexLock lock(&mu_);
  std::string request_id;
  absl::StatusOr<Record*> found =
      FindInStateLocked(attempt_id, "OnAttemptFailed",
                        {RequestState::kQueued, RequestState::kPrefilling,
                         RequestState::kTransferring, RequestState::kDecoding},
                        &request_id);
  if (!found.ok()) return found.status();
  Record& rec = **found;
  return FailAttemptLocked(request_id, rec, error);
}

}  // namespace baton::coordinator
