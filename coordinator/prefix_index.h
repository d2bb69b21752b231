// The coordinator's view of every worker's prefix cache, built from the
// cache events workers send with their heartbeats (a snapshot after each
// registration, deltas after that; worker/service/registrar.cc): for each
// worker, the set of block hashes it holds. Routing asks how many leading
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
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/types.h"
#include "worker/kv_cache/prefix_hash.h"

namespace baton::coordinator {

class PrefixIndex {
 public:
  // Applies one heartbeat's events: with `snapshot`, `stored` replaces all
  // the worker held; otherwise it adds `stored` and drops `removed`.
  void Apply(const WorkerId& worker, bool snapshot,
             std::span<const BlockHash> stored,
             std::span<const BlockHash> removed);
  // Drops everything of the worker (a new registration, a removal).
  void Forget(const WorkerId& worker);
  // How many leading hashes of `chain` the worker holds.
  int64_t MatchLength(const WorkerId& worker,
                      std::span<const BlockHash> chain) const;
  // Hashes held by the worker (for tests and status).
  int64_t NumBlocks(const WorkerId& worker) const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<WorkerId, absl::flat_hash_set<BlockHash>> by_worker_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::coordinator

#endif  // BATON_COORDINATOR_PREFIX_INDEX_H_
