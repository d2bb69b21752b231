// Host bytes for the KV of one transfer between a device runner's pool and
// a host transport (TCP), instead of a host mirror of the whole device pool:
// only the transferred blocks, only while they travel.
//
// KvStagingPool hands out StagedKv areas of exactly the blocks a transfer
// carries: from the runner's bounded staging pool (ForwardRunner::
// host_staging(), page-locked by a CUDA runner) while it has room, otherwise
// from a cache of their own (pageable, mapped on first touch and unmapped
// with the area), so a full staging pool slows a transfer down but never
// fails it. An area frees its blocks when destroyed.
//
// Thread safety: Acquire and StagedKv's destructor from any thread; the
// pool's allocation state is guarded by the KvStagingPool's mutex, which a
// receiver holds shared while it reads a staged table (mutex()).
#ifndef BATON_WORKER_ENGINE_KV_STAGING_H_
#define BATON_WORKER_ENGINE_KV_STAGING_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/kv_cache/block_table.h"
#include "worker/kv_cache/kv_cache.h"
#include "worker/kv_cache/kv_layout.h"

namespace baton {

class KvStagingPool;

class StagedKv {
 public:
  ~StagedKv();
  StagedKv(const StagedKv&) = delete;
  StagedKv& operator=(const StagedKv&) = delete;

  // The staging cache and the table holding the area's blocks.
  KvCache& cache() const { return *cache_; }
  const BlockTable& table() const { return table_; }
  int64_t num_blocks() const { return table_.num_blocks(); }
  // True when the blocks came from the runner's staging pool.
  bool pooled() const { return owned_ == nullptr; }
  // Guards the cache's allocation state (null for an area of its own).
  absl::Mutex* mutex() const { return mu_; }

 private:
  friend class KvStagingPool;
  StagedKv(KvCache* cache, absl::Mutex* mu, std::unique_ptr<KvCache> owned)
      : cache_(cache), mu_(mu), owned_(std::move(owned)) {}

  KvCache* cache_;
  absl::Mutex* mu_;
  std::unique_ptr<KvCache> owned_;
  BlockTable table_;
};

class KvStagingPool {
 public:
  // pool: the runner's staging cache (null: every area is one of its own),
  // which must outlive this and every area; layout: the engine cache's,
  // which the pool's must equal.
  KvStagingPool(KvCache* pool, const KvLayout& layout);

  // An area of num_blocks (>= 1) blocks. ResourceExhausted naming the bytes
  // only if an area of its own cannot be mapped; InvalidArgument for a bad
  // count.
  absl::StatusOr<std::unique_ptr<StagedKv>> Acquire(int64_t num_blocks);

  // Areas handed out from the pool / of their own, since creation.
  int64_t pooled_areas() const { return pooled_.load(); }
  int64_t own_areas() const { return own_.load(); }
  // The pool's blocks now held by areas (0 without a pool).
  int64_t pool_blocks_used() const;

 private:
  KvCache* const pool_;
  const KvLayout layout_;
  mutable absl::Mutex mu_;
  std::atomic<int64_t> pooled_{0};
  std::atomic<int64_t> own_{0};
};

}  // namespace baton

#endif  // BATON_WORKER_ENGINE_KV_STAGING_H_
