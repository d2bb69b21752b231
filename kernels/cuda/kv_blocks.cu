#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kv_blocks.h"

namespace baton::cuda {
namespace {

constexpr int kThreads = 256;
// Chunks beyond this many blocks are handled by a grid-stride loop.
constexpr int64_t kMaxBlocks = 65535;

// One block per chunk (grid-stride over chunks); threads stride over the
// chunk's `units` elements of type T (chunk_bytes / sizeof(T)). gather: pool
// chunk -> staging chunk; otherwise staging -> pool.
template <typename T>
__global__ void CopyChunksKernel(const T* src, T* dst, bool gather,
                                 int64_t layer, int64_t num_blocks,
                                 uint64_t units,
                                 const int32_t* __restrict__ block_ids,
                                 int64_t num_chunks) {
  for (int64_t c = blockIdx.x; c < num_chunks; c += gridDim.x) {
    const int64_t id = block_ids[c];
    const uint64_t staging_offset = static_cast<uint64_t>(c) * units;
    if (id < 0 || id >= num_blocks) {
      if (gather) {
        // Every byte 0xFF.
        T* out = dst + staging_offset;
        for (uint64_t i = threadIdx.x; i < units; i += blockDim.x) {
          unsigned char* bytes = reinterpret_cast<unsigned char*>(out + i);
          for (unsigned k = 0; k < sizeof(T); ++k) bytes[k] = 0xFF;
        }
      }
      continue;
    }
    const uint64_t pool_offset =
        static_cast<uint64_t>(layer * num_blocks + id) * units;
    const T* from = src + (gather ? pool_offset : staging_offset);
    T* to = dst + (gather ? staging_offset : pool_offset);
    for (uint64_t i = threadIdx.x; i < units; i += blockDim.x) to[i] = from[i];
  }
}

bool Aligned(const void* p, uint64_t width) {
  return reinterpret_cast<uintptr_t>(p) % width == 0;
}

template <typename T>
void LaunchCopy(const void* src, void* dst, bool gather, int64_t layer,
                const KvPoolGeometry& g, const int32_t* block_ids,
                int64_t num_chunks, cudaStream_t stream) {
  const unsigned blocks =
      static_cast<unsigned>(num_chunks < kMaxBlocks ? num_chunks : kMaxBlocks);
  const uint64_t units = g.chunk_bytes / sizeof(T);
  const int threads =
      static_cast<int>(units >= kThreads ? kThreads : (units + 31) / 32 * 32);
  CopyChunksKernel<T><<<blocks, threads, 0, stream>>>(
      static_cast<const T*>(src), static_cast<T*>(dst), gather, layer,
      g.num_blocks, units, block_ids, num_chunks);
}

cudaError_t Copy(const void* src, void* dst, bool gather,
                 const KvPoolGeometry& g, int64_t layer,
                 const int32_t* block_ids, int64_t num_chunks,
                 cudaStream_t stream) {
  if (g.num_layers <= 0 || g.num_blocks <= 0 || g.chunk_bytes == 0) {
    return cudaErrorInvalidValue;
  }
  // Pool and staging byte counts must fit in int64.
  const uint64_t kLimit = INT64_MAX;
  const uint64_t chunks_in_pool =
      static_cast<uint64_t>(g.num_layers) * static_cast<uint64_t>(g.num_blocks);
  if (static_cast<uint64_t>(g.num_blocks) > kLimit / g.num_layers ||
      g.chunk_bytes > kLimit / chunks_in_pool) {
    return cudaErrorInvalidValue;
  }
  if (layer < 0 || layer >= g.num_layers || num_chunks < 0) {
    return cudaErrorInvalidValue;
  }
  if (num_chunks > 0 &&
      g.chunk_bytes > kLimit / static_cast<uint64_t>(num_chunks)) {
    return cudaErrorInvalidValue;
  }
  if (num_chunks == 0) return cudaSuccess;
  if (src == nullptr || dst == nullptr || block_ids == nullptr) {
    return cudaErrorInvalidValue;
  }
  const auto fits = [&](uint64_t width) {
    return g.chunk_bytes % width == 0 && Aligned(src, width) &&
           Aligned(dst, width);
  };
  if (fits(16)) {
    LaunchCopy<uint4>(src, dst, gather, layer, g, block_ids, num_chunks,
                      stream);
  } else if (fits(8)) {
    LaunchCopy<uint2>(src, dst, gather, layer, g, block_ids, num_chunks,
                      stream);
  } else if (fits(4)) {
    LaunchCopy<uint32_t>(src, dst, gather, layer, g, block_ids, num_chunks,
                         stream);
  } else {
    LaunchCopy<uint8_t>(src, dst, gather, layer, g, block_ids, num_chunks,
                        stream);
  }
  BATON_CUDA_RETURN_LAUNCH_ERROR();
}

struct CopyRunBatch {
  CopyRun runs[kCopyRunsPerLaunch];
};
static_assert(sizeof(CopyRunBatch) <= 4000,
              "kernel parameters are limited to 4 KiB");

// blockIdx.y picks the run; the x blocks and their threads stride over it.
__global__ void CopyRunsKernel(const __grid_constant__ CopyRunBatch batch) {
  const CopyRun run = batch.runs[blockIdx.y];
  const uint64_t first =
      static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const auto* src = static_cast<const unsigned char*>(run.src);
  auto* dst = static_cast<unsigned char*>(run.dst);
  if ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) |
       run.bytes) %
          16 ==
      0) {
    const uint64_t units = run.bytes / 16;
    const auto* s16 = reinterpret_cast<const uint4*>(src);
    auto* d16 = reinterpret_cast<uint4*>(dst);
    for (uint64_t i = first; i < units; i += stride) d16[i] = s16[i];
  } else {
    for (uint64_t i = first; i < run.bytes; i += stride) dst[i] = src[i];
  }
}

}  // namespace

cudaError_t CopyRuns(const CopyRun* runs, int64_t n, cudaStream_t stream) {
  if (n < 0 || (n > 0 && runs == nullptr)) return cudaErrorInvalidValue;
  for (int64_t i = 0; i < n; ++i) {
    if (runs[i].bytes > 0 &&
        (runs[i].dst == nullptr || runs[i].src == nullptr)) {
      return cudaErrorInvalidValue;
    }
  }
  // 16 KiB per block per pass (256 threads x 16 bytes x 4): a 64 KiB run
  // gets 4 blocks, a whole layer in one run up to 2048.
  constexpr uint64_t kBytesPerBlock = uint64_t{kThreads} * 16 * 4;
  constexpr uint64_t kMaxBlocksPerRun = 2048;
  for (int64_t start = 0; start < n; start += kCopyRunsPerLaunch) {
    CopyRunBatch batch;
    const int64_t count =
        n - start < kCopyRunsPerLaunch ? n - start : kCopyRunsPerLaunch;
    uint64_t largest = 0;
    for (int64_t i = 0; i < count; ++i) {
      batch.runs[i] = runs[start + i];
      if (batch.runs[i].bytes > largest) largest = batch.runs[i].bytes;
    }
    if (largest == 0) continue;
    uint64_t blocks = (largest + kBytesPerBlock - 1) / kBytesPerBlock;
    if (blocks > kMaxBlocksPerRun) blocks = kMaxBlocksPerRun;
    CopyRunsKernel<<<dim3(static_cast<unsigned>(blocks),
                          static_cast<unsigned>(count)),
                     kThreads, 0, stream>>>(batch);
    BATON_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return cudaSuccess;
}

cudaError_t GatherKvLayer(const void* pool, const KvPoolGeometry& geometry,
                          int64_t layer, const int32_t* block_ids,
                          int64_t num_chunks, void* staging,
                          cudaStream_t stream) {
  return Copy(pool, staging, true, geometry, layer, block_ids, num_chunks,
              stream);
}

cudaError_t ScatterKvLayer(const void* staging, const KvPoolGeometry& geometry,
                           int64_t layer, const int32_t* block_ids,
                           int64_t num_chunks, void* pool,
                           cudaStream_t stream) {
  return Copy(staging, pool, false, geometry, layer, block_ids, num_chunks,
              stream);
}

}  // namespace baton::cuda
