// The engine's side of the prefix cache: publishing the blocks each step
// fills (prompt and output alike, so a conversation's next turn finds the
// answer as well as the question) and resetting the cache. Admission's
// lookup is the scheduler's (scheduler.h).
#include <algorithm>

#include "worker/engine/engine.h"

namespace baton {

void Engine::PublishFullBlocks(const std::vector<ScheduledItem>& scheduled) {
  const int64_t block_size = cache_->block_size();
  absl::MutexLock lock(&cache_mu_);
  BlockAllocator& allocator = cache_->allocator();
  for (const ScheduledItem& s : scheduled) {
    Sequence* seq = s.seq;
    const int64_t full = seq->num_cached / block_size;
    if (full <= seq->num_published) continue;
    ExtendBlockHashes(prefix_root_, seq->tokens, block_size, full,
                      &seq->block_hashes);
    for (int64_t i = seq->num_published; i < full; ++i) {
      // False when another block holds the hash already (two requests
      // computed the same prefix at once): this copy stays private.
      allocator.Publish(seq->table, i,
                        seq->block_hashes[static_cast<size_t>(i)]);
    }
    seq->num_published = full;
  }
}

int64_t Engine::ResetPrefixCache() {
  absl::MutexLock lock(&cache_mu_);
  return cache_->allocator().ResetPrefixCache();
}

}  // namespace baton
