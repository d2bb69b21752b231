// KV targets that follow their Prefill. A coordinator that reserves the
// decode worker's blocks while the prompt is being computed sends Prefill
// with kv_target_follows, then the reservation's target (SetKvTarget). The
// handoff's sink factory runs on the handoff's sender thread, not the
// engine's: it waits there for the target, while the layers the engine
// finishes meanwhile stay in the pool (the engine holds the blocks until
// the handoff ends) and leave once it arrives.
#ifndef BATON_WORKER_SERVICE_FOLLOWING_KV_TARGETS_H_
#define BATON_WORKER_SERVICE_FOLLOWING_KV_TARGETS_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "baton/v1/worker.pb.h"
#include "worker/engine/kv_sink.h"

namespace baton {

// The targets awaited by request id. A target may come before its Prefill
// (the two are separate calls: a long prompt's Prefill may still be on the
// wire): it is kept for `early_ttl`, and the Prefill finds it.
class FollowingKvTargets {
 public:
  explicit FollowingKvTargets(absl::Duration early_ttl)
      : early_ttl_(early_ttl) {}

  // Registers the wait of `request_id` (taking a target that came first).
  // AlreadyExists if it has one.
  absl::Status Expect(const std::string& request_id);
  // Delivers its target. FailedPrecondition for a second one while the
  // first is kept, InvalidArgument for a target without a HOST_TCP endpoint
  // or a transfer id. A target that comes after its Prefill ended is kept
  // as an early one (and OK): the coordinator learns how the attempt ended
  // from the Prefill's stream, not from this call.
  absl::Status Deliver(const std::string& request_id,
                       const v1::KvTarget& target);
  // Ends its wait (the prefill ended, or was cancelled): a factory still
  // waiting fails with `why`. Idempotent.
  void End(const std::string& request_id, const absl::Status& why);
  // Blocks until the target of `request_id` is delivered: the target, why
  // its wait ended, or DeadlineExceeded after `timeout`.
  absl::StatusOr<v1::KvTarget> Await(const std::string& request_id,
                                     absl::Duration timeout);
  // Ends every wait with `why` (the worker is going), and refuses each
  // later Expect with it. `why` must not be OK.
  void Close(const absl::Status& why);

 private:
  struct Slot {
    std::optional<v1::KvTarget> target;
    absl::Status ended;     // OK while waiting
    bool expected = false;  // its Prefill is here
  };
  // Drops the targets that came early and found no Prefill in time.
  void DropExpiredLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The entry of `request_id` (null when new; valid until the map next
  // changes), or why none is taken (Close).
  absl::StatusOr<std::shared_ptr<Slot>*> SlotLocked(
      const std::string& request_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static bool Ready(Slot* slot) {
    return slot->target.has_value() || !slot->ended.ok();
  }
  const absl::Duration early_ttl_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Slot>> slots_
      ABSL_GUARDED_BY(mu_);
  struct Early {
    absl::Time expires;
    std::string request_id;
    std::weak_ptr<Slot> slot;
  };
  std::deque<Early> early_ ABSL_GUARDED_BY(mu_);  // by expiry
  absl::Status closed_ ABSL_GUARDED_BY(mu_);      // OK while open
};

// The HOST_TCP endpoint of `target` (its endpoint or an alternative) and
// its transfer id, or InvalidArgument naming what is missing.
struct HostTcpTarget {
  std::string address;
  uint64_t transfer_id = 0;
};
absl::StatusOr<HostTcpTarget> ParseHostTcpTarget(const v1::KvTarget& target);

// A sink opened from block 0 before its target said which blocks the
// decode worker already holds: `inner` (opened at the target's first
// block) takes the rest, and the handoff leaves out each layer's first
// `held` blocks (KvSink::leading_blocks_held).
class HeldLeadingBlocksSink : public ForwardingKvSink {
 public:
  HeldLeadingBlocksSink(std::unique_ptr<KvSink> inner, int64_t held)
      : ForwardingKvSink(std::move(inner)), held_(held) {}
  int64_t leading_blocks_held() const override { return held_; }

 private:
  const int64_t held_;
};

}  // namespace baton

#endif  // BATON_WORKER_SERVICE_FOLLOWING_KV_TARGETS_H_
