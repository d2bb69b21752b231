// The coordinator's view of every worker's prefix cache, built from the
// cache events workers send with their heartbeats (a snapshot after each
// registration, deltas after that; worker/service/registrar.cc): for each
// block hash, the workers that hold it. Routing asks how many leading
// blocks of a request's prompt a worker holds (MatchLength) and weighs that
// against load (routing_policy.h).
//
// It is a hint: a block may be evicted between a heartbeat and the request
// reaching the worker (the worker then computes it; tokens are the same),
// and a worker's snapshot is capped (WorkerService::kMaxPrefixCacheEvents).
// Thread-safe.
#ifndef BATON_COORDINATOR_PREFIX_INDEX_H_
#define BATON_COORDINATOR_PREFIX_INDEX_H_

#include <cstdint>
#include <span>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/types.h"
#include "worker/kv_cache/prefix_hash.h"

namespace baton::coordinator {

class PrefixIndex {
 public:
  // Applies one heartbeat's events: with `snapshot`, `stored` replaces all
  // the worker held; otherwise it adds `stored` and drops `removed`. A
  // worker cannot cache more blocks than its KV pool has: if it would then
  // hold more than `max_blocks`, everything of it is dropped instead (its
  // events are wrong; memory here stays bounded by the pools) and Apply
  // returns false.
  bool Apply(const WorkerId& worker, bool snapshot,
             std::span<const BlockHash> stored,
             std::span<const BlockHash> removed,
             int64_t max_blocks = INT64_MAX);
  // Drops everything of the worker (a new registration, a removal). Walks
  // the whole index: registrations are rare, routing is not.
  void Forget(const WorkerId& worker);
  // How many leading hashes of `chain` the worker holds.
  int64_t MatchLength(const WorkerId& worker,
                      std::span<const BlockHash> chain) const;
  // MatchLength of every worker holding at least the first hash, in one
  // walk down the chain that follows only the workers still matching (the
  // cost is the matched depth times the workers holding it, not the
  // cluster's size times the chain).
  absl::flat_hash_map<WorkerId, int64_t> MatchAll(
      std::span<const BlockHash> chain) const;
  // Hashes held by the worker (for tests and status).
  int64_t NumBlocks(const WorkerId& worker) const;

 private:
  using Slot = uint32_t;
  // Which workers hold a block: their slots, ascending.
  using Holders = absl::InlinedVector<Slot, 2>;

  Slot SlotLocked(const WorkerId& worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropBlocksLocked(Slot slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<WorkerId, Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<WorkerId> ids_ ABSL_GUARDED_BY(mu_);    // by slot
  std::vector<int64_t> counts_ ABSL_GUARDED_BY(mu_);  // blocks by slot
  std::vector<Slot> free_slots_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<BlockHash, Holders> holders_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::coordinator

#endif  // BATON_COORDINATOR_PREFIX_INDEX_H_
