// The engine's counts for the worker's load and metrics (EngineStats).
#include "worker/engine/engine.h"

namespace baton {

EngineStats Engine::stats() {
  EngineStats s;
  s.num_waiting = published_waiting_.load(std::memory_order_relaxed);
  s.num_running = published_running_.load(std::memory_order_relaxed);
  s.steps = published_steps_.load(std::memory_order_relaxed);
  s.prefill_tokens_per_second = prefill_rate_.tokens_per_second();
  s.num_handoffs = published_handoffs_.load(std::memory_order_relaxed);
  absl::MutexLock lock(&cache_mu_);
  s.num_imports = static_cast<int64_t>(imports_.size());
  s.kv_blocks_total = cache_->num_blocks_total();
  s.kv_blocks_free = cache_->num_blocks_free();
  s.kv_blocks_cached = cache_->num_blocks_cached();
  s.kv_blocks_used = cache_->allocator().num_blocks_used();
  s.kv_blocks_reserved = ReservedImportBlocksLocked();
  s.kv_evictions = cache_->allocator().num_evictions();
  if (staging_ != nullptr) {
    s.kv_staging_blocks_used = staging_->pool_blocks_used();
    s.kv_staging_own_areas = staging_->own_areas();
  }
  s.prefix_query_tokens =
      published_prefix_queries_.load(std::memory_order_relaxed) +
      import_prefix_queries_.load(std::memory_order_relaxed);
  s.prefix_hit_tokens = published_prefix_hits_.load(std::memory_order_relaxed) +
                        import_prefix_hits_.load(std::memory_order_relaxed);
  return s;
}

int64_t Engine::ReservedImportBlocksLocked() const {
  int64_t blocks = 0;
  for (const auto& [id, slot] : imports_) {
    // The blocks a transfer is still to fill (a cached prefix it pinned
    // may be shared: not counted).
    if (slot->state == ImportSlot::State::kReserved ||
        slot->state == ImportSlot::State::kTransferring) {
      blocks += slot->table.num_blocks() - slot->first_block;
    }
  }
  return blocks;
}

}  // namespace baton
