// The engine's side of the prefix cache: publishing the blocks each step
// fills (prompt and output alike, so a conversation's next turn finds the
// answer as well as the question) and resetting the cache. Admission's
// lookup is the scheduler's (scheduler.h).
#include <algorithm>

#include "worker/engine/engine.h"

namespace baton {

void Engine::PublishFullBlocks(const std::vector<ScheduledItem>& scheduled) {
  absl::MutexLock lock(&cache_mu_);
  for (const ScheduledItem& s : scheduled) {
    baton::PublishFullBlocks(prefix_root_, cache_->allocator(), s.seq);
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
