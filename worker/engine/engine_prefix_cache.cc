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

Engine::PrefixCacheEvents Engine::PrefixCacheEventsSince(
    std::optional<uint64_t> after, size_t max_events) {
  PrefixCacheEvents out;
  absl::MutexLock lock(&cache_mu_);
  const BlockAllocator& allocator = cache_->allocator();
  std::vector<KvCacheEvent> events;
  if (after.has_value() && allocator.EventsSince(*after, max_events, &events)) {
    // Each hash once, by its last event: the receiver applies the two
    // lists in either order.
    absl::flat_hash_map<BlockHash, bool> last;
    for (const KvCacheEvent& e : events) last[e.hash] = e.stored;
    for (const KvCacheEvent& e : events) {
      auto it = last.find(e.hash);
      if (it == last.end()) continue;
      (it->second ? out.stored : out.removed).push_back(e.hash);
      last.erase(it);
    }
    out.last_seq = events.empty() ? *after : events.back().seq;
    return out;
  }
  out.snapshot = true;
  out.stored = allocator.PublishedHashes();
  if (out.stored.size() > max_events) out.stored.resize(max_events);
  out.last_seq = allocator.last_event_seq();
  return out;
}

int64_t Engine::ResetPrefixCache() {
  absl::MutexLock lock(&cache_mu_);
  return cache_->allocator().ResetPrefixCache();
}

}  // namespace baton
