#include "worker/service/following_kv_targets.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace baton {

absl::StatusOr<std::shared_ptr<FollowingKvTargets::Slot>*>
FollowingKvTargets::SlotLocked(const std::string& request_id) {
  if (!closed_.ok()) return closed_;
  DropExpiredLocked();
  return &slots_[request_id];
}

absl::Status FollowingKvTargets::Expect(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::shared_ptr<Slot>*> found = SlotLocked(request_id);
  if (!found.ok()) return found.status();
  std::shared_ptr<Slot>& slot = **found;
  if (slot == nullptr) {
    slot = std::make_shared<Slot>();
  } else if (slot->expected) {
    return absl::AlreadyExistsError(absl::StrCat(
        "request '", request_id, "' already waits for its KV target here"));
  }
  slot->expected = true;
  return absl::OkStatus();
}

absl::Status FollowingKvTargets::Deliver(const std::string& request_id,
                                         const v1::KvTarget& target) {
  if (absl::StatusOr<HostTcpTarget> parsed = ParseHostTcpTarget(target);
      !parsed.ok()) {
    return parsed.status();
  }
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::shared_ptr<Slot>*> found = SlotLocked(request_id);
  if (!found.ok()) return found.status();
  std::shared_ptr<Slot>& slot = **found;
  if (slot == nullptr) {
    // Before its Prefill.
    slot = std::make_shared<Slot>();
    early_.push_back({absl::Now() + early_ttl_, request_id, slot});
  } else if (slot->target.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("request '", request_id, "' already has its KV target"));
  }
  slot->target = target;
  return absl::OkStatus();
}

void FollowingKvTargets::DropExpiredLocked() {
  const absl::Time now = absl::Now();
  while (!early_.empty() && early_.front().expires <= now) {
    const Early& e = early_.front();
    auto it = slots_.find(e.request_id);
    if (it != slots_.end() && it->second == e.slot.lock() &&
        !it->second->expected) {
      slots_.erase(it);
    }
    early_.pop_front();
  }
}

void FollowingKvTargets::End(const std::string& request_id,
                             const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  auto it = slots_.find(request_id);
  if (it == slots_.end()) return;
  if (it->second->ended.ok()) {
    it->second->ended =
        why.ok() ? absl::CancelledError("the prefill ended") : why;
  }
  slots_.erase(it);
}

void FollowingKvTargets::Close(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  closed_ = why.ok() ? absl::UnavailableError("closed") : why;
  for (auto& [id, slot] : slots_) {
    if (slot->ended.ok()) slot->ended = closed_;
  }
  slots_.clear();
  early_.clear();
}

absl::StatusOr<v1::KvTarget> FollowingKvTargets::Await(
    const std::string& request_id, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto it = slots_.find(request_id);
  if (it == slots_.end()) {
    if (!closed_.ok()) return closed_;
    return absl::CancelledError(absl::StrCat(
        "the prefill of '", request_id, "' ended before its KV target came"));
  }
  // The slot outlives its entry (End erases it while this waits).
  const std::shared_ptr<Slot> slot = it->second;
  if (!mu_.AwaitWithTimeout(absl::Condition(&Ready, slot.get()), timeout)) {
    if (auto now = slots_.find(request_id);
        now != slots_.end() && now->second == slot) {
      slots_.erase(now);
    }
    return absl::DeadlineExceededError(
        absl::StrCat("the KV target of '", request_id, "' did not come within ",
                     absl::FormatDuration(timeout)));
  }
  if (slot->target.has_value()) return *slot->target;
  return slot->ended;
}

absl::StatusOr<HostTcpTarget> ParseHostTcpTarget(const v1::KvTarget& target) {
  HostTcpTarget out;
  const auto host_tcp = [](const v1::KvEndpoint& e) {
    return (e.transport() == v1::KV_TRANSPORT_HOST_TCP ||
            e.transport() == v1::KV_TRANSPORT_UNSPECIFIED) &&
           !e.address().empty();
  };
  if (host_tcp(target.endpoint())) {
    out.address = target.endpoint().address();
  } else {
    for (const v1::KvEndpoint& e : target.alternatives()) {
      if (host_tcp(e)) {
        out.address = e.address();
        break;
      }
    }
  }
  if (out.address.empty()) {
    return absl::InvalidArgumentError(
        "kv_target: a target that follows its Prefill needs a HOST_TCP "
        "endpoint with an address");
  }
  if (!absl::SimpleAtoi(target.transfer_id(), &out.transfer_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_target.transfer_id: '", target.transfer_id(),
                     "' is not a transfer id from ReserveKv"));
  }
  return out;
}

}  // namespace baton
