// Streams one prefilled sequence's KV cache to a KvSink on a sender thread
// of its own, layer by layer as the engine reports layers complete, so the
// engine thread never waits on the network.
//
// The engine thread calls LayerReady(l) after layer l of the prompt's last
// chunk is written (every earlier chunk wrote its layers in earlier steps).
// The sender thread hands that layer's chunks to the sink IN PLACE
// (KvSink::SendLayerChunks: the TCP sender hashes each slice just before it
// sendmsg's it from the pool, no copy), while the engine computes later layers
// (different bytes of the pool). A finished layer is never written again: the
// engine detaches the sequence from the scheduler after its last chunk, so
// nothing appends to, preempts or frees its blocks until the handoff ends.
// After the last layer the thread calls Finish() and reports through on_done.
// The blocks must stay reserved until done() (or until Detach() returned).
//
// Every read of the pool by the sender thread (and the sink) is bracketed by
// a read gate; Detach revokes it, waiting only for a bracketed read in
// progress (one slice's hash and non-blocking sendmsg, never a wait
// for the peer), so a handoff timeout frees the blocks at once even while
// the sink is stuck.
#ifndef BATON_WORKER_ENGINE_KV_HANDOFF_H_
#define BATON_WORKER_ENGINE_KV_HANDOFF_H_

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/engine/kv_sink.h"
#include "worker/engine/request.h"
#include "worker/kv_cache/kv_cache.h"

namespace baton {

// Where a handoff reads chunk (layer, block) of a pool with its layout:
// base + layer * layer_stride + block * chunk_bytes. Host memory, or a
// device pool's addresses for a sink that reads device memory.
struct KvPoolAddress {
  const uint8_t* base = nullptr;
  uint64_t layer_stride = 0;
  uint64_t chunk_bytes = 0;

  const uint8_t* Chunk(int64_t layer, int32_t block) const {
    return base + static_cast<uint64_t>(layer) * layer_stride +
           static_cast<uint64_t>(block) * chunk_bytes;
  }
  // The host bytes of `cache` (REQUIRES: cache.has_host_storage()).
  static KvPoolAddress Host(const KvCache& cache);
  // A device pool laid out like `cache`'s blocks (ForwardRunner::
  // device_kv_pool).
  static KvPoolAddress Device(const KvCache& cache, const uint8_t* pool);
};

struct KvHandoffResult {
  // OK iff the sink confirmed every layer.
  absl::Status status;
  KvHandoffMetrics metrics;
};

class KvHandoff {
 public:
  // Starts the sender thread, which opens the sink with make_sink(info).
  // block_ids: in `pool`, the blocks the handoff carries (the sequence's
  // blocks [info.first_block, BlocksNeeded(info.num_tokens)), or where they
  // are staged). on_done runs once on the sender thread when the result is
  // final.
  KvHandoff(KvPoolAddress pool, KvSinkInfo info, std::vector<int32_t> block_ids,
            KvSinkFactory make_sink, std::function<void()> on_done);
  // Aborts with Cancelled unless finished, and joins the thread.
  ~KvHandoff();
  KvHandoff(const KvHandoff&) = delete;
  KvHandoff& operator=(const KvHandoff&) = delete;

  // Layers 0..layer are complete in the pool. Never blocks on the sink.
  void LayerReady(int64_t layer);
  // Ends the handoff with `reason` (the sink is aborted) unless it already
  // finished. Does not wait.
  void Abort(absl::Status reason);
  // Abort, then revokes the read gate, waiting only for a read of the pool
  // in progress: once it returns neither the thread nor the sink reads the
  // pool again, so the blocks may be freed while the thread is still stuck
  // in the sink.
  void Detach(absl::Status reason);

  bool done() const;
  // REQUIRES: done().
  KvHandoffResult result() const;

 private:
  // The gate the sink reads the pool under (pool_mu_ held between Enter
  // and Exit; closed once detached_).
  class PoolGate : public KvReadGate {
   public:
    explicit PoolGate(KvHandoff* handoff) : handoff_(handoff) {}
    bool Enter() override;
    void Exit() override;

   private:
    KvHandoff* handoff_;
  };

  void Run();

  const KvPoolAddress pool_;
  const KvSinkInfo info_;
  const std::vector<int32_t> block_ids_;
  KvSinkFactory make_sink_;
  std::function<void()> on_done_;
  const Clock::time_point start_;

  mutable absl::Mutex mu_;
  int64_t layers_ready_ ABSL_GUARDED_BY(mu_) = 0;
  Clock::time_point last_ready_ ABSL_GUARDED_BY(mu_);
  absl::Status abort_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  KvHandoffResult result_ ABSL_GUARDED_BY(mu_);

  // Held while the pool is read (PoolGate); Detach takes it to revoke.
  absl::Mutex pool_mu_;
  bool detached_ ABSL_GUARDED_BY(pool_mu_) = false;
  PoolGate gate_{this};

  std::thread thread_;
};

}  // namespace baton

#endif  // BATON_WORKER_ENGINE_KV_HANDOFF_H_
