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
  // The staging pool: whole blocks of every layer, no more than the device
  // pool has. Page-locked so the copies are DMA; pageable memory still
  // works (slower), so a refusal (e.g. RLIMIT_MEMLOCK) is reported and
  // tolerated.
  const uint64_t block_all_layers =
      cache->chunk_bytes() * static_cast<uint64_t>(cache->layout().num_layers);
  const int64_t staging_blocks = static_cast<int64_t>(
      std::min<uint64_t>(options.host_staging_bytes / block_all_layers,
                         static_cast<uint64_t>(cache->num_blocks_total())));
  if (staging_blocks > 0) {
    BATON_ASSIGN_OR_RETURN(
        engine_runner->staging_,
        KvCache::Create(KvCacheOptionsFor(cache->layout(), staging_blocks)));
    KvCache& pool = *engine_runner->staging_;
    const cudaError_t pinned =
        cudaHostRegister(const_cast<uint8_t*>(pool.pool_data()),
                         pool.pool_bytes(), cudaHostRegisterDefault);
    if (pinned == cudaSuccess) {
      engine_runner->host_registered_ = true;
    } else {
      (void)cudaGetLastError();  // not sticky; clear it
      std::fprintf(stderr,
                   "baton: host KV staging pool (%llu bytes) not page-locked "
                   "(%s); KV staging copies use pageable memory\n",
                   static_cast<unsigned long long>(pool.pool_bytes()),
                   cudaGetErrorString(pinned));
    }
  }
  return engine_runner;
}

CudaEngineRunner::~CudaEngineRunner() {
  if (cudaSetDevice(runner_->device()) != cudaSuccess) return;
  if (copy_stream_ != nullptr) {
    cudaStreamSynchronize(copy_stream_);
    cudaStreamDestroy(copy_stream_);
  }
  if (host_registered_) {
    cudaHostUnregister(const_cast<uint8_t*>(staging_->pool_data()));
  }
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

absl::Status CudaEngineRunner::CopyStaged(int64_t layer,
                                          const KvStagingCopy& copy,
                                          cudaMemcpyKind kind) {
  const uint64_t chunk = cache_->chunk_bytes();
  auto* device = static_cast<uint8_t*>(runner_->pool());
  const uint64_t layer_offset =
      static_cast<uint64_t>(layer) * runner_->num_blocks() * chunk;
  const std::span<const int32_t> host_ids = copy.staged->block_ids();
  const std::span<const int32_t> dev_ids = copy.table->block_ids();
  if (copy.first_block < 0 ||
      static_cast<size_t>(copy.first_block) + host_ids.size() >
          dev_ids.size()) {
    return absl::InternalError(
        absl::StrCat("KV staging of ", host_ids.size(), " blocks from block ",
                     copy.first_block, " of a table of ", dev_ids.size()));
  }
  const std::span<const int32_t> dev =
      dev_ids.subspan(static_cast<size_t>(copy.first_block));
  size_t i = 0;
  while (i < host_ids.size()) {
    size_t end = i + 1;
    while (end < host_ids.size() && dev[end] == dev[end - 1] + 1 &&
           host_ids[end] == host_ids[end - 1] + 1) {
      ++end;
    }
    uint8_t* host = copy.host->LayerBlock(layer, host_ids[i]);
    uint8_t* on_device =
        device + layer_offset + static_cast<uint64_t>(dev[i]) * chunk;
    const uint64_t bytes = (end - i) * chunk;
    const cudaError_t err =
        kind == cudaMemcpyDeviceToHost
            ? cudaMemcpyAsync(host, on_device, bytes, kind, copy_stream_)
            : cudaMemcpyAsync(on_device, host, bytes, kind, copy_stream_);
    if (err != cudaSuccess) {
      return CudaStatus(err, "cudaMemcpyAsync (KV staging)");
    }
    i = end;
  }
  return absl::OkStatus();
}

absl::Status CudaEngineRunner::CopyLayerToHost(
    int64_t layer, std::span<const KvStagingCopy> copies) {
  BATON_RETURN_IF_ERROR(health());
  absl::Status status =
      CudaStatus(cudaSetDevice(runner_->device()), "cudaSetDevice");
  for (const KvStagingCopy& copy : copies) {
    if (!status.ok()) break;
    status = CopyStaged(layer, copy, cudaMemcpyDeviceToHost);
  }
  if (status.ok()) {
    status = CudaStatus(cudaStreamSynchronize(copy_stream_),
                        "cudaStreamSynchronize (KV staging)");
  }
  if (!status.ok()) return Fail(status);
  return status;
}

absl::Status CudaEngineRunner::CopyToDevice(const KvStagingCopy& copy) {
  BATON_RETURN_IF_ERROR(health());
  absl::Status status =
      CudaStatus(cudaSetDevice(runner_->device()), "cudaSetDevice");
  for (int64_t l = 0; status.ok() && l < cache_->layout().num_layers; ++l) {
    status = CopyStaged(l, copy, cudaMemcpyHostToDevice);
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
