#include "worker/cuda/cuda_engine_runner.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/cuda/device_memory.h"

namespace baton {

absl::StatusOr<std::unique_ptr<CudaEngineRunner>> CudaEngineRunner::Create(
    const ModelWeights* weights, KvCache* cache,
    const CudaRunnerOptions& options) {
  CudaRunnerOptions runner_options = options;
  runner_options.allocator = cache;
  BATON_ASSIGN_OR_RETURN(
      std::unique_ptr<CudaModelRunner> runner,
      CudaModelRunner::Create(weights, cache->layout(),
                              cache->num_blocks_total(), runner_options));
  std::unique_ptr<CudaEngineRunner> engine_runner(
      new CudaEngineRunner(cache, std::move(runner)));
  BATON_RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&engine_runner->copy_stream_,
                                           cudaStreamNonBlocking),
                 "cudaStreamCreateWithFlags (KV staging stream)"));
  // Page-locked staging makes the copies DMA; pageable memory still works
  // (slower), so a refusal (e.g. RLIMIT_MEMLOCK) is reported and tolerated.
  // Pinning commits the whole mirror in host RAM, so a pool beyond
  // kMaxPinnedStagingBytes stays pageable (device-direct transports do not
  // stage through it).
  constexpr uint64_t kMaxPinnedStagingBytes = uint64_t{8} << 30;
  const cudaError_t pinned =
      cache->pool_bytes() > kMaxPinnedStagingBytes
          ? cudaErrorMemoryAllocation
          : cudaHostRegister(cache->LayerBlock(0, 0), cache->pool_bytes(),
                             cudaHostRegisterDefault);
  if (pinned == cudaSuccess) {
    engine_runner->host_registered_ = true;
  } else {
    (void)cudaGetLastError();  // not sticky; clear it
    std::fprintf(stderr,
                 "baton: host KV pool (%llu bytes) not page-locked (%s); KV "
                 "staging copies use pageable memory\n",
                 static_cast<unsigned long long>(cache->pool_bytes()),
                 cudaGetErrorString(pinned));
  }
  return engine_runner;
}

CudaEngineRunner::~CudaEngineRunner() {
  if (cudaSetDevice(runner_->device()) != cudaSuccess) return;
  if (copy_stream_ != nullptr) {
    cudaStreamSynchronize(copy_stream_);
    cudaStreamDestroy(copy_stream_);
  }
  if (host_registered_) cudaHostUnregister(cache_->LayerBlock(0, 0));
}

absl::Status CudaEngineRunner::Fail(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (health_.ok()) health_ = status;
  return status;
}

absl::Status CudaEngineRunner::Forward(std::span<const ForwardItem> items,
                                       std::vector<float>* logits,
                                       const LayerDoneFn& on_layer_done) {
  absl::Status status = runner_->Forward(items, logits, on_layer_done);
  if (!runner_->healthy()) Fail(runner_->unhealthy_reason()).IgnoreError();
  return status;
}

absl::Status CudaEngineRunner::health() const {
  absl::MutexLock lock(&mu_);
  return health_;
}

std::string CudaEngineRunner::device_name() const {
  return absl::StrCat("cuda:", runner_->device());
}

absl::Status CudaEngineRunner::CopyBlocks(int64_t layer,
                                          std::span<const int32_t> blocks,
                                          cudaMemcpyKind kind) {
  const uint64_t chunk = cache_->chunk_bytes();
  auto* device = static_cast<uint8_t*>(runner_->pool());
  const uint64_t layer_offset =
      static_cast<uint64_t>(layer) * runner_->num_blocks() * chunk;
  size_t i = 0;
  while (i < blocks.size()) {
    size_t end = i + 1;
    while (end < blocks.size() && blocks[end] == blocks[end - 1] + 1) ++end;
    uint8_t* host = cache_->LayerBlock(layer, blocks[i]);
    uint8_t* dev =
        device + layer_offset + static_cast<uint64_t>(blocks[i]) * chunk;
    const uint64_t bytes = (end - i) * chunk;
    const cudaError_t err =
        kind == cudaMemcpyDeviceToHost
            ? cudaMemcpyAsync(host, dev, bytes, kind, copy_stream_)
            : cudaMemcpyAsync(dev, host, bytes, kind, copy_stream_);
    if (err != cudaSuccess) {
      return CudaStatus(err, "cudaMemcpyAsync (KV staging)");
    }
    i = end;
  }
  return absl::OkStatus();
}

absl::Status CudaEngineRunner::CopyLayerToHost(
    int64_t layer, std::span<const BlockTable* const> tables) {
  BATON_RETURN_IF_ERROR(health());
  absl::Status status =
      CudaStatus(cudaSetDevice(runner_->device()), "cudaSetDevice");
  for (const BlockTable* table : tables) {
    if (!status.ok()) break;
    status = CopyBlocks(layer, table->block_ids(), cudaMemcpyDeviceToHost);
  }
  if (status.ok()) {
    status = CudaStatus(cudaStreamSynchronize(copy_stream_),
                        "cudaStreamSynchronize (KV staging)");
  }
  if (!status.ok()) return Fail(status);
  return status;
}

absl::Status CudaEngineRunner::CopyToDevice(const BlockTable& table,
                                            int64_t first_block) {
  BATON_RETURN_IF_ERROR(health());
  absl::Status status =
      CudaStatus(cudaSetDevice(runner_->device()), "cudaSetDevice");
  // Only the blocks that hold the imported tokens; those before first_block
  // are a prefix this pool holds already.
  const int64_t end = std::min<int64_t>(
      table.num_blocks(), cache_->BlocksNeeded(table.num_tokens()));
  const std::span<const int32_t> blocks =
      table.block_ids()
          .first(static_cast<size_t>(end))
          .subspan(static_cast<size_t>(std::min(first_block, end)));
  for (int64_t l = 0; status.ok() && l < cache_->layout().num_layers; ++l) {
    status = CopyBlocks(l, blocks, cudaMemcpyHostToDevice);
  }
  if (status.ok()) {
    status = CudaStatus(cudaStreamSynchronize(copy_stream_),
                        "cudaStreamSynchronize (KV staging)");
  }
  if (!status.ok()) return Fail(status);
  return status;
}

absl::StatusOr<std::string> CudaDeviceIdentity(int device) {
  cudaDeviceProp prop{};
  const cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cudaGetDeviceProperties(", device, "): ", cudaGetErrorName(err), " (",
        cudaGetErrorString(err), ")"));
  }
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  std::string uuid = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) uuid += '-';
    absl::StrAppend(&uuid, absl::Hex(static_cast<uint8_t>(prop.uuid.bytes[i]),
                                     absl::kZeroPad2));
  }
  return absl::StrCat(host, "/", uuid);
}

ForwardRunnerFactory MakeCudaRunnerFactory(const CudaRunnerOptions& options) {
  return [options](
             const ModelWeights* weights, KvCache* cache,
             ThreadPool*) -> absl::StatusOr<std::unique_ptr<ForwardRunner>> {
    BATON_ASSIGN_OR_RETURN(std::unique_ptr<CudaEngineRunner> runner,
                           CudaEngineRunner::Create(weights, cache, options));
    return runner;
  };
}

}  // namespace baton
