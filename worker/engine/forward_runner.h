// What an Engine runs its batches on: the forward pass over a KvCache's
// block tables, on the CPU (ModelRunner) or on a device whose KV pool has
// the cache's layout and block ids (CudaEngineRunner).
//
// The engine's KvCache is always the allocator (block tables, accounting,
// prefix index). On the CPU it also holds the bytes; a device runner keeps
// them in its own pool, and the cache then has no host storage at all
// (reads_host_kv(), KvCache::DropHostStorage). A host transport (TCP) needs
// host bytes: the engine stages just the transferred blocks in a bounded host
// staging pool (host_staging(), page-locked by a CUDA runner), copied there
// from the device layer by layer for a handoff (CopyLayerToHost) and from there
// into the device before an imported sequence decodes (CopyToDevice). Device-
// direct transports (CUDA IPC, NCCL) read and write the device pool.
#ifndef BATON_WORKER_ENGINE_FORWARD_RUNNER_H_
#define BATON_WORKER_ENGINE_FORWARD_RUNNER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cpu/thread_pool.h"
#include "worker/engine/model_weights.h"
#include "worker/kv_cache/block_table.h"
#include "worker/kv_cache/kv_cache.h"

namespace baton {

enum class LogitsMode {
  kNone,  // a prefill chunk that is not the prompt's last
  kLast,  // next-token logits only
  kAll,   // one row per token (teacher forcing, prompt logprobs)
};

struct ForwardItem {
  BlockTable* table = nullptr;  // reserved for start_pos + tokens.size()
  int64_t start_pos = 0;        // == tokens already in the cache
  std::span<const int32_t> tokens;
  LogitsMode logits = LogitsMode::kLast;
};

// One sequence's blocks [first_block, first_block + staged->num_blocks())
// of `table` (the runner's pool), and where they are staged on the host:
// block i of `staged` (a table of the staging cache `host`) holds block
// first_block + i of `table`.
struct KvStagingCopy {
  const BlockTable* table = nullptr;
  int64_t first_block = 0;
  KvCache* host = nullptr;
  const BlockTable* staged = nullptr;
};

// Called after layer `layer` has written the K/V of every item (prefill
// workers stream that layer to a decode worker meanwhile).
using LayerDoneFn = std::function<void(int64_t layer)>;

class ForwardRunner {
 public:
  virtual ~ForwardRunner() = default;

  // Runs the items as one batch. On success each item's table holds
  // start_pos + tokens.size() tokens, and `logits` holds, item by item, one
  // row of vocab_size floats per requested position. InvalidArgument (naming
  // the item) for a bad item; nothing is written then. Any other error fails
  // the whole batch.
  virtual absl::Status Forward(std::span<const ForwardItem> items,
                               std::vector<float>* logits,
                               const LayerDoneFn& on_layer_done) = 0;

  // OK while the runner computes correct results; after a device fault, the
  // first error (every later Forward then fails). Thread-safe: callable
  // while another thread is in Forward. The CPU runner is always healthy.
  virtual absl::Status health() const { return absl::OkStatus(); }

  // Where the runner computes: "cpu" or "cuda:N".
  virtual std::string device_name() const { return "cpu"; }

  // Copies layer `layer` of each copy's blocks from the runner's pool to
  // its staging blocks (the K/V this step wrote included). Called from
  // on_layer_done(layer) for the sequences whose KV is handed off over a
  // host transport. Only called when device_kv_pool() is set.
  virtual absl::Status CopyLayerToHost(int64_t layer,
                                       std::span<const KvStagingCopy> copies) {
    (void)layer;
    (void)copies;
    return absl::OkStatus();
  }

  // Copies every layer of the staged blocks (an import that arrived over a
  // host transport) into the runner's pool before the sequence's first
  // step; the blocks before copy.first_block were the runner's already (a
  // cached prefix). Only called when device_kv_pool() is set.
  virtual absl::Status CopyToDevice(const KvStagingCopy& copy) {
    (void)copy;
    return absl::OkStatus();
  }

  // Device address of chunk (layer 0, block 0) of the runner's KV pool,
  // which has the cache's layout: chunk (l, b) lies at (l * num_blocks_total
  // + b) * chunk_bytes from it. Null when the cache's host bytes are the
  // live KV (the CPU). Device-direct KV transports read and write it.
  virtual uint8_t* device_kv_pool() const { return nullptr; }

  // With device_kv_pool(): the host staging pool for host transports (same
  // layout, its own block ids; see KvStagingCopy), or null to stage every
  // transfer in memory of its own. The engine guards its allocation state.
  virtual KvCache* host_staging() { return nullptr; }

  // With device_kv_pool(): whether the runner still reads or writes the
  // cache's host bytes (a stand-in that computes on the CPU); when false the
  // engine drops them (KvCache::DropHostStorage).
  virtual bool reads_host_kv() const { return true; }
};

// Builds an engine's runner over its host cache (the allocator) and thread
// pool, which outlive the runner.
using ForwardRunnerFactory =
    std::function<absl::StatusOr<std::unique_ptr<ForwardRunner>>(
        const ModelWeights* weights, KvCache* cache, ThreadPool* pool)>;

}  // namespace baton

#endif  // BATON_WORKER_ENGINE_FORWARD_RUNNER_H_
