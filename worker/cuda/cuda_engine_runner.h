// The Engine's runner on a CUDA device (EngineOptions::make_runner): a
// CudaModelRunner whose device KV pool has the engine's KvCache layout and
// block ids; the cache is its allocator alone (the engine drops its host
// storage: reads_host_kv() is false). Host KV transports go through a
// bounded, page-locked staging pool (host_staging()): a handoff's carried
// blocks are copied device -> staging as each layer completes
// (CopyLayerToHost), an import staging -> device before its first decode
// step (CopyToDevice).
//
// Thread safety: as CudaModelRunner (one engine thread calls Forward and the
// copies); health() and device_name() from any thread.
#ifndef BATON_WORKER_CUDA_CUDA_ENGINE_RUNNER_H_
#define BATON_WORKER_CUDA_CUDA_ENGINE_RUNNER_H_

#include <cuda_runtime_api.h>

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/cuda/cuda_model_runner.h"
#include "worker/engine/forward_runner.h"

namespace baton {

class CudaEngineRunner : public ForwardRunner {
 public:
  // `options.allocator` is replaced by `cache`, whose layout and block count
  // size the device pool; options.host_staging_bytes sizes the staging
  // pool. Errors as CudaModelRunner::Create (device missing:
  // FailedPrecondition; out of device memory: ResourceExhausted naming the
  // bytes).
  static absl::StatusOr<std::unique_ptr<CudaEngineRunner>> Create(
      const ModelWeights* weights, KvCache* cache,
      const CudaRunnerOptions& options);
  ~CudaEngineRunner() override;

  absl::Status Forward(std::span<const ForwardItem> items,
                       std::vector<float>* logits,
                       const LayerDoneFn& on_layer_done) override;
  absl::Status health() const override;
  std::string device_name() const override;
  absl::Status CopyLayerToHost(int64_t layer,
                               std::span<const KvStagingCopy> copies) override;
  absl::Status CopyToDevice(const KvStagingCopy& copy) override;
  uint8_t* device_kv_pool() const override {
    return static_cast<uint8_t*>(runner_->pool());
  }
  KvCache* host_staging() override { return staging_.get(); }
  bool reads_host_kv() const override { return false; }

  CudaModelRunner& runner() { return *runner_; }

 private:
  CudaEngineRunner(KvCache* cache, std::unique_ptr<CudaModelRunner> runner)
      : cache_(cache), runner_(std::move(runner)) {}
  // Queues the copies of layer `layer` of the staged blocks between the
  // device pool and the staging cache, a run of consecutive ids on both
  // sides as one copy.
  absl::Status CopyStaged(int64_t layer, const KvStagingCopy& copy,
                          cudaMemcpyKind kind);
  absl::Status Fail(absl::Status status);

  KvCache* const cache_;
  std::unique_ptr<CudaModelRunner> runner_;
  cudaStream_t copy_stream_ = nullptr;
  std::unique_ptr<KvCache> staging_;  // null: no staging pool
  bool host_registered_ = false;      // staging_ is page-locked
  mutable absl::Mutex mu_;
  absl::Status health_ ABSL_GUARDED_BY(mu_);
};

// EngineOptions::make_runner for a CUDA device (options.device).
ForwardRunnerFactory MakeCudaRunnerFactory(const CudaRunnerOptions& options);

// "HOSTNAME/GPU-<uuid>" of CUDA device `device`: equal for two processes
// exactly when they use the same GPU (WorkerServiceOptions::kv_device).
// FailedPrecondition naming the CUDA error without such a device.
absl::StatusOr<std::string> CudaDeviceIdentity(int device);

}  // namespace baton

#endif  // BATON_WORKER_CUDA_CUDA_ENGINE_RUNNER_H_
