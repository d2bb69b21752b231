// What the paged attention kernels (paged_attention_prefill.cu,
// paged_attention_decode.cu) share: host-side argument checks and device-side
// reading of the paged pool. Not a public header; nvcc only.
#ifndef BATON_KERNELS_CUDA_PAGED_ATTENTION_INTERNAL_H_
#define BATON_KERNELS_CUDA_PAGED_ATTENTION_INTERNAL_H_

#ifndef __CUDACC__
#error "paged_attention_internal.h is for .cu files"
#endif

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/paged_attention.h"

namespace baton::cuda::paged_attention_internal {

// Largest num_seqs: the sequence index is a grid dimension limited to 65535.
inline constexpr int64_t kMaxSeqs = 65535;
inline constexpr int64_t kMaxKvHeads = 1024;
inline constexpr int64_t kMaxBlockSize = 1024;
// log2(e): the kernels work with exp2 of scores scaled by scale * log2(e).
inline constexpr float kLog2e = 1.4426950408889634f;

inline bool Aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// The pool's geometry and the head counts; true when the kernels support
// them. Does not look at device memory.
inline bool PoolShapeOk(const PagedKvPoolView& kv, int64_t num_heads) {
  if (kv.head_dim != 64 && kv.head_dim != 128) return false;
  if (kv.num_kv_heads < 1 || kv.num_kv_heads > kMaxKvHeads) return false;
  if (kv.block_size < 1 || kv.block_size > kMaxBlockSize) return false;
  if (kv.num_blocks < 1 || kv.num_blocks > INT32_MAX) return false;
  if (kv.layer < 0 || kv.layer > 1024) return false;
  if (num_heads < 1 || num_heads % kv.num_kv_heads != 0) return false;
  if (num_heads / kv.num_kv_heads > kPagedAttentionMaxGroup) return false;
  // Every element offset of the layer region must fit int64 comfortably.
  const int64_t half_chunk = kv.num_kv_heads * kv.block_size * kv.head_dim;
  if (kv.num_blocks > (INT64_MAX / 4) / ((kv.layer + 1) * 2 * half_chunk)) {
    return false;
  }
  return kv.pool != nullptr && Aligned16(kv.pool);
}

// Elements of one K (or V) half of a chunk.
inline int64_t HalfChunkElements(const PagedKvPoolView& kv) {
  return kv.num_kv_heads * kv.block_size * kv.head_dim;
}

// First element of the layer's region. REQUIRES: PoolShapeOk(kv, ...).
inline const uint16_t* LayerBase(const PagedKvPoolView& kv) {
  return kv.pool + kv.layer * kv.num_blocks * 2 * HalfChunkElements(kv);
}

// The layer's region and its geometry, as the kernels read it.
struct DevicePool {
  const uint16_t* layer_base;
  int64_t half_chunk;  // elements of K (or V) of one block
  int32_t num_blocks;
  int32_t block_size;
};

inline DevicePool MakeDevicePool(const PagedKvPoolView& kv) {
  return DevicePool{LayerBase(kv), HalfChunkElements(kv),
                    static_cast<int32_t>(kv.num_blocks),
                    static_cast<int32_t>(kv.block_size)};
}

__device__ inline float QuietNaN() { return __int_as_float(0x7fc00000); }

// Element offset, in the layer region, of K[key][kv_head][0] where the key's
// block is `block` (V is half_chunk further).
__device__ inline int64_t KeyOffset(const DevicePool& pool, int32_t block,
                                    int32_t kv_head, int32_t slot,
                                    int32_t head_dim) {
  return static_cast<int64_t>(block) * 2 * pool.half_chunk +
         (static_cast<int64_t>(kv_head) * pool.block_size + slot) * head_dim;
}

// The two halves packed in a 32-bit word, low half first, as floats.
__device__ inline float2 HalvesToFloats(uint32_t w) {
  return make_float2(
      __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu))),
      __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16))));
}

// 8 consecutive halves (16 bytes) as floats.
__device__ inline void EightHalvesToFloats(const uint4& raw, float* f) {
  const float2 a = HalvesToFloats(raw.x);
  const float2 b = HalvesToFloats(raw.y);
  const float2 c = HalvesToFloats(raw.z);
  const float2 d = HalvesToFloats(raw.w);
  f[0] = a.x;
  f[1] = a.y;
  f[2] = b.x;
  f[3] = b.y;
  f[4] = c.x;
  f[5] = c.y;
  f[6] = d.x;
  f[7] = d.y;
}

}  // namespace baton::cuda::paged_attention_internal

#endif  // BATON_KERNELS_CUDA_PAGED_ATTENTION_INTERNAL_H_
