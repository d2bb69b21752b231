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

}  // namespace baton::cuda

#endif  // BATON_KERNELS_CUDA_KV_BLOCKS_H_
