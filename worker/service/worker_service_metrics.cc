// WorkerService's metrics: gauges from the engine, KV imports measured at
// the receiver, and stream ends that never reached the engine; and the
// prefix cache's admin reset.
#include <algorithm>
#include <utility>

#include "common/metrics/metrics.h"
#include "common/tsan/annotations.h"
#include "worker/service/worker_service.h"
#include "worker/service/worker_service_internal.h"

namespace baton {

void WorkerService::RefreshMetrics() {
  metrics_->Refresh(engine_->stats(), queued_prefill_tokens_.load(),
                    SteadyClock::now());
}

grpc::ServerUnaryReactor* WorkerService::ResetPrefixCache(
    grpc::CallbackServerContext* context,
    const v1::ResetWorkerPrefixCacheRequest* /*request*/,
    v1::ResetWorkerPrefixCacheResponse* response) {
  const TsanHandlerScope handler(this);  // see common/tsan/annotations.h
  response->set_blocks_dropped(engine_->ResetPrefixCache());
  return FinishUnary(context, absl::OkStatus());
}

v1::PrefixCacheEvents WorkerService::PrefixCacheEvents(
    std::optional<uint64_t> after, uint64_t* last_seq) {
  v1::PrefixCacheEvents out;
  if (!engine_->prefix_cache_enabled()) return out;
  Engine::PrefixCacheEvents events =
      engine_->PrefixCacheEventsSince(after, kMaxPrefixCacheEvents);
  out.set_snapshot(events.snapshot);
  out.set_stored(PackHashes(events.stored));
  out.set_removed(PackHashes(events.removed));
  *last_seq = events.last_seq;
  return out;
}

void WorkerService::RecordEnd(absl::string_view phase,
                              const absl::Status& status) {
  metrics_->OnRequestEnded(phase, metrics::StatusCodeLabel(status.code()));
}

KvReceiverCallbacks WorkerService::MeteredImportCallbacks() {
  KvReceiverCallbacks callbacks = engine_->ImportCallbacks();
  callbacks.lookup =
      [this, lookup = std::move(callbacks.lookup)](
          uint64_t transfer_id) -> absl::StatusOr<KvTransferTarget> {
    absl::StatusOr<KvTransferTarget> target = lookup(transfer_id);
    if (target.ok() && target->cache != nullptr) {
      InboundTransfer inbound;
      inbound.start = SteadyClock::now();
      // What travels: the blocks from first_block on (the rest was cached).
      const int64_t blocks =
          target->cache->BlocksNeeded(target->num_tokens) - target->first_block;
      inbound.bytes = static_cast<uint64_t>(std::max<int64_t>(0, blocks)) *
                      target->cache->chunk_bytes() *
                      static_cast<uint64_t>(target->expected_layout.num_layers);
      absl::MutexLock lock(&inbound_mu_);
      inbound_[transfer_id] = inbound;
    }
    return target;
  };
  callbacks.on_done = [this, on_done = std::move(callbacks.on_done)](
                          uint64_t transfer_id, absl::Status status) {
    {
      absl::MutexLock lock(&inbound_mu_);
      auto it = inbound_.find(transfer_id);
      if (it != inbound_.end()) {
        if (status.ok()) {
          metrics_->OnKvReceived(it->second.bytes,
                                 std::chrono::duration<double>(
                                     SteadyClock::now() - it->second.start)
                                     .count());
        }
        inbound_.erase(it);
      }
    }
    on_done(transfer_id, std::move(status));
  };
  return callbacks;
}

}  // namespace baton
