// Gathering one layer of a sequence's KV blocks from the device KV pool into a
// contiguous staging buffer for transfer, and scattering a received layer
// back into blocks: the device side of KvCache::ExportLayer / ImportLayer
// (worker/kv_cache/kv_cache.h). The payload is the same: the layer's chunks
// (K then V, chunk_bytes each) concatenated in block-table order.
#ifndef BATON_KERNELS_CUDA_KV_BLOCKS_H_
#define BATON_KERNELS_CUDA_KV_BLOCKS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace baton::cuda {

// Shape of a device KV pool laid out as worker/kv_cache/kv_layout.h:
// chunk (layer l, block b) starts at byte (l * num_blocks + b) * chunk_bytes.
struct KvPoolGeometry {
  int64_t num_layers = 0;
  int64_t num_blocks = 0;    // blocks per layer (KvCache::num_blocks_total)
  uint64_t chunk_bytes = 0;  // KvLayout::chunk_bytes()
};

// staging[c * chunk_bytes, (c + 1) * chunk_bytes) = chunk (layer,
// block_ids[c]) for c < num_chunks.
//   pool:      device, num_layers * num_blocks * chunk_bytes bytes
//   block_ids: device, int32 [num_chunks]; an id outside [0, num_blocks)
//              fills its staging chunk with 0xFF bytes (NaN halves) and reads
//              nothing (the caller validates ids on the host beforehand)
//   staging:   device, num_chunks * chunk_bytes bytes; must not overlap pool
// Copies 16, 8, 4 or 1 bytes per access, the widest that chunk_bytes and both
// base pointers allow.
// cudaErrorInvalidValue without launching for a geometry with a count <= 0,
// a pool size that overflows, layer outside [0, num_layers), num_chunks < 0,
// or a null pointer while num_chunks > 0. Asynchronous on `stream`.
cudaError_t GatherKvLayer(const void* pool, const KvPoolGeometry& geometry,
                          int64_t layer, const int32_t* block_ids,
                          int64_t num_chunks, void* staging,
                          cudaStream_t stream);

// The inverse: chunk (layer, block_ids[c]) = staging chunk c for c <
// num_chunks. A chunk whose id is outside [0, num_blocks) is skipped (nothing
// is written out of bounds). Ids should be distinct: two chunks scattered
// to one block leave either one there. Arguments and errors as
// GatherKvLayer.
cudaError_t ScatterKvLayer(const void* staging, const KvPoolGeometry& geometry,
                           int64_t layer, const int32_t* block_ids,
                           int64_t num_chunks, void* pool, cudaStream_t stream);

// One byte range to copy: what a KV transfer between two pools (of one
// process, or IPC-mapped) turns into after merging adjacent blocks.
struct CopyRun {
  void* dst = nullptr;
  const void* src = nullptr;
  uint64_t bytes = 0;
};

// Copies every run with kernels instead of one DMA copy each: one launch per
// kCopyRunsPerLaunch runs (their descriptors passed as the kernel's
// parameter, so nothing is allocated or copied from the host first). Many
// small runs (a fragmented block table: one 64 KiB run per block) then move
// at device-memory speed instead of one copy engine call each. Each run
// moves in 16-byte accesses where its pointers and length allow, bytes
// otherwise. Every pointer must be device memory the current device can
// address (its own, or another process's mapped by cudaIpcOpenMemHandle);
// destinations must not overlap each other or any source.
// cudaErrorInvalidValue without launching for n < 0, a null `runs` while
// n > 0, or a run with bytes > 0 and a null pointer. Asynchronous on
// `stream`.
inline constexpr int kCopyRunsPerLaunch = 128;
cudaError_t CopyRuns(const CopyRun* runs, int64_t n, cudaStream_t stream);

}  // namespace baton::cuda

#endif  // BATON_KERNELS_CUDA_KV_BLOCKS_H_
