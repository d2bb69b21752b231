// A stand-in for a device runner, for engine tests without a device: the
// CPU ModelRunner computes, but between steps the live KV of every block a
// batch touched lives in a separate "device" copy and the engine's cache
// holds a poison pattern there, as a device runner's cache holds no live
// KV. So a handoff over a host transport sends the right KV only if the
// engine staged it (CopyLayerToHost into its staging blocks), and an
// imported sequence decodes correctly only if the engine called
// CopyToDevice. The staging pool has control->staging_blocks blocks (0:
// none, so every transfer stages in memory of its own). Faults can be
// injected into Forward and the copies.
#ifndef BATON_WORKER_ENGINE_SHADOW_RUNNER_TEST_UTIL_H_
#define BATON_WORKER_ENGINE_SHADOW_RUNNER_TEST_UTIL_H_

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/engine/forward_runner.h"
#include "worker/engine/model_runner.h"

namespace baton::testing {

// What a ShadowRunner does; shared with the test, which may change it
// between steps.
struct ShadowRunnerControl {
  // Forward calls from this one on (1-based) fail with Internal and the
  // runner turns unhealthy; 0: never.
  std::atomic<int64_t> fail_forward_at{0};
  // Copy calls fail with Internal when set.
  std::atomic<bool> fail_copy_to_host{false};
  std::atomic<bool> fail_copy_to_device{false};
  // Copies do nothing (an engine that skipped them) when set.
  std::atomic<bool> skip_copies{false};
  // Blocks of the host staging pool (set before the runner is created).
  int64_t staging_blocks = 64;
  // Observed calls.
  std::atomic<int64_t> forwards{0};
  std::atomic<int64_t> table_layers_copied_to_host{0};  // per table
  std::atomic<int64_t> tables_copied_to_device{0};
  // Staging copies (a table and layer each) through the runner's staging
  // pool / through an area of its own.
  std::atomic<int64_t> pooled_stagings{0};
  std::atomic<int64_t> own_stagings{0};
};

class ShadowRunner : public ForwardRunner {
 public:
  // F16 value 1.0 in every element: finite, and far from any real K/V.
  static constexpr uint8_t kPoisonLo = 0x00, kPoisonHi = 0x3C;

  ShadowRunner(std::unique_ptr<ModelRunner> inner, KvCache* cache,
               std::shared_ptr<ShadowRunnerControl> control)
      : inner_(std::move(inner)),
        cache_(cache),
        control_(std::move(control)),
        device_(new uint8_t[cache->pool_bytes()]()) {
    if (control_->staging_blocks > 0) {
      staging_ = std::move(KvCache::Create(KvCacheOptionsFor(
                               cache->layout(), control_->staging_blocks)))
                     .value();
    }
  }

  static ForwardRunnerFactory Factory(
      std::shared_ptr<ShadowRunnerControl> control) {
    return [control](const ModelWeights* weights, KvCache* cache,
                     ThreadPool* pool)
               -> absl::StatusOr<std::unique_ptr<ForwardRunner>> {
      auto inner = ModelRunner::Create(weights, cache, pool);
      if (!inner.ok()) return inner.status();
      return std::make_unique<ShadowRunner>(std::move(*inner), cache, control);
    };
  }

  absl::Status Forward(std::span<const ForwardItem> items,
                       std::vector<float>* logits,
                       const LayerDoneFn& on_layer_done) override {
    const int64_t n = ++control_->forwards;
    if (!health().ok()) return absl::FailedPreconditionError("runner failed");
    const int64_t fail_at = control_->fail_forward_at.load();
    if (fail_at > 0 && n >= fail_at) {
      const absl::Status fault =
          absl::InternalError("injected device fault in step");
      absl::MutexLock lock(&mu_);
      health_ = fault;
      return fault;
    }
    const int64_t layers = cache_->layout().num_layers;
    for (int64_t l = 0; l < layers; ++l) {
      for (const ForwardItem& item : items) Move(*item.table, l, true);
    }
    absl::Status status = inner_->Forward(items, logits, [&](int64_t l) {
      for (const ForwardItem& item : items) Move(*item.table, l, false);
      if (on_layer_done) on_layer_done(l);
    });
    return status;
  }

  absl::Status health() const override {
    absl::MutexLock lock(&mu_);
    return health_;
  }
  std::string device_name() const override { return "shadow:0"; }
  uint8_t* device_kv_pool() const override { return device_.get(); }

  KvCache* host_staging() override { return staging_.get(); }

  absl::Status CopyLayerToHost(int64_t layer,
                               std::span<const KvStagingCopy> copies) override {
    if (control_->fail_copy_to_host) {
      return absl::InternalError("injected copy-to-host fault");
    }
    if (control_->skip_copies) return absl::OkStatus();
    for (const KvStagingCopy& copy : copies) {
      Stage(copy, layer, /*to_host=*/true);
      ++control_->table_layers_copied_to_host;
    }
    return absl::OkStatus();
  }

  absl::Status CopyToDevice(const KvStagingCopy& copy) override {
    if (control_->fail_copy_to_device) {
      return absl::InternalError("injected copy-to-device fault");
    }
    if (control_->skip_copies) return absl::OkStatus();
    // Only the imported blocks: the device holds the cached prefix already.
    for (int64_t l = 0; l < cache_->layout().num_layers; ++l) {
      Stage(copy, l, /*to_host=*/false);
    }
    ++control_->tables_copied_to_device;
    return absl::OkStatus();
  }

 private:
  uint8_t* DeviceChunk(int64_t layer, int32_t block) {
    return device_.get() +
           (static_cast<uint64_t>(layer) * cache_->num_blocks_total() +
            static_cast<uint64_t>(block)) *
               cache_->chunk_bytes();
  }
  // to_host: device -> host (before a step). Otherwise host -> device, then
  // the host chunk is poisoned (after a layer is written).
  void Move(const BlockTable& table, int64_t layer, bool to_host) {
    for (int32_t b : table.block_ids()) {
      uint8_t* host = cache_->LayerBlock(layer, b);
      if (to_host) {
        std::memcpy(host, DeviceChunk(layer, b), cache_->chunk_bytes());
        continue;
      }
      std::memcpy(DeviceChunk(layer, b), host, cache_->chunk_bytes());
      for (uint64_t i = 0; i + 1 < cache_->chunk_bytes(); i += 2) {
        host[i] = kPoisonLo;
        host[i + 1] = kPoisonHi;
      }
    }
  }
  // Between the device chunks of copy.table's blocks from first_block on
  // and the staged blocks, one layer.
  void Stage(const KvStagingCopy& copy, int64_t layer, bool to_host) {
    ++(copy.host == staging_.get() ? control_->pooled_stagings
                                   : control_->own_stagings);
    const std::span<const int32_t> staged = copy.staged->block_ids();
    for (size_t i = 0; i < staged.size(); ++i) {
      uint8_t* device = DeviceChunk(
          layer,
          copy.table->block_ids()[static_cast<size_t>(copy.first_block) + i]);
      uint8_t* host = copy.host->LayerBlock(layer, staged[i]);
      if (to_host) {
        std::memcpy(host, device, cache_->chunk_bytes());
      } else {
        std::memcpy(device, host, cache_->chunk_bytes());
      }
    }
  }

  std::unique_ptr<ModelRunner> inner_;
  KvCache* cache_;
  std::shared_ptr<ShadowRunnerControl> control_;
  std::unique_ptr<uint8_t[]> device_;  // the "device" pool
  std::unique_ptr<KvCache> staging_;
  mutable absl::Mutex mu_;
  absl::Status health_;
};

}  // namespace baton::testing

#endif  // BATON_WORKER_ENGINE_SHADOW_RUNNER_TEST_UTIL_H_
