// What an Engine runs its batches on: the forward pass over a host KvCache's
// block tables, on the CPU (ModelRunner) or on a device whose KV pool mirrors
// the host cache's layout and block ids (CudaEngineRunner).
//
// The host KvCache is always the allocator (block tables, accounting) and
// the KV transports' staging area. A device runner keeps the live KV in its
// own pool and copies a handoff's layers to the host cache
// (CopyLayerToHost) before the sender reads them, and an imported cache from
// the host into its pool (CopyToDevice) before the sequence decodes.
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

  // Makes layer `layer` of every block of every table readable in the host
  // cache (the K/V this step wrote included). Called from on_layer_done(layer),
  // for the sequences whose KV is handed off. A no-op where the host cache is
  // the live cache.
  virtual absl::Status CopyLayerToHost(
      int64_t layer, std::span<const BlockTable* const> tables) {
    (void)layer;
    (void)tables;
    return absl::OkStatus();
  }

  // Makes the table's blocks from first_block on that hold its tokens
  // (every layer, as imported into the host cache) the runner's before the
  // sequence's first step; the blocks before first_block were the runner's
  // already (a cached prefix). A no-op where the host cache is the live
  // cache.
  virtual absl::Status CopyToDevice(const BlockTable& table,
                                    int64_t first_block) {
    (void)table;
    (void)first_block;
    return absl::OkStatus();
  }

  // Device address of chunk (layer 0, block 0) of the runner's KV pool,
  // which has the host cache's layout (chunk (l, b) lies at the same offset
  // from it as in the host pool); null when the host cache is the live
  // cache. Device-direct KV transports read and write it.
  virtual uint8_t* device_kv_pool() const { return nullptr; }
};

// Builds an engine's runner over its host cache (the allocator) and thread
// pool, which outlive the runner.
using ForwardRunnerFactory =
    std::function<absl::StatusOr<std::unique_ptr<ForwardRunner>>(
        const ModelWeights* weights, KvCache* cache, ThreadPool* pool)>;

}  // namespace baton

#endif  // BATON_WORKER_ENGINE_FORWARD_RUNNER_H_
