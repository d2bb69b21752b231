#include "worker/engine/kv_staging.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace baton {

StagedKv::~StagedKv() {
  if (mu_ != nullptr) {
    absl::MutexLock lock(mu_);
    cache_->Free(table_);
  } else {
    cache_->Free(table_);
  }
}

KvStagingPool::KvStagingPool(KvCache* pool, const KvLayout& layout)
    : pool_(pool), layout_(layout) {
  if (pool_ != nullptr) {
    BATON_CHECK(pool_->layout() == layout_)
        << "staging pool " << pool_->layout().ToString() << " vs cache "
        << layout_.ToString();
  }
}

int64_t KvStagingPool::pool_blocks_used() const {
  if (pool_ == nullptr) return 0;
  absl::MutexLock lock(&mu_);
  return pool_->num_blocks_used();
}

absl::StatusOr<std::unique_ptr<StagedKv>> KvStagingPool::Acquire(
    int64_t num_blocks) {
  if (num_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV staging area of ", num_blocks, " blocks (needs at least 1)"));
  }
  const int64_t tokens = num_blocks * layout_.block_size;
  if (pool_ != nullptr) {
    // Destroyed outside the lock when the pool is full (its destructor
    // takes the lock).
    std::unique_ptr<StagedKv> area(new StagedKv(pool_, &mu_, nullptr));
    bool reserved = false;
    {
      absl::MutexLock lock(&mu_);
      if (pool_->CanReserve(area->table_, tokens)) {
        BATON_CHECK(pool_->Reserve(area->table_, tokens).ok());
        reserved = true;
      }
    }
    if (reserved) {
      pooled_.fetch_add(1);
      return area;
    }
  }
  BATON_ASSIGN_OR_RETURN(
      std::unique_ptr<KvCache> own,
      KvCache::Create(KvCacheOptionsFor(layout_, num_blocks)));
  KvCache* cache = own.get();
  std::unique_ptr<StagedKv> area(new StagedKv(cache, nullptr, std::move(own)));
  BATON_RETURN_IF_ERROR(cache->Reserve(area->table_, tokens));
  own_.fetch_add(1);
  return area;
}

}  // namespace baton
