// What the row kernels of sampling.h (sampling_argmax.cu, sampling_draw.cu)
// share: the launch shape, the order-preserving logit key, block-wide
// reductions and the best-logit search, and the host-side argument check.
// Not a public header; nvcc only.
//
// One block of kThreads threads per row; every loop whose trip count matters
// for __syncthreads() is driven by values that are identical in all threads
// of the block (read from shared memory after a barrier), so barriers are
// never divergent.
#ifndef BATON_KERNELS_CUDA_SAMPLING_INTERNAL_H_
#define BATON_KERNELS_CUDA_SAMPLING_INTERNAL_H_

#ifndef __CUDACC__
#error "sampling_internal.h is for .cu files"
#endif

#include <cuda_runtime_api.h>

#include <cfloat>
#include <cstdint>

namespace baton::cuda::sampling_internal {

inline constexpr int kThreads = 512;
inline constexpr int kWarps = kThreads / 32;
inline constexpr unsigned kFullMask = 0xFFFFFFFFu;
// Histogram bins per descent level: 3 levels resolve any 32-bit key range
// (2^32 / 2048 = 2^21 keys per bin, then 2^10, then 1).
inline constexpr int kBins = 2048;
// Masses are round(weight * 2^40); weights are <= 1, so a row of up to
// kMaxVocab tokens sums below 2^63.
inline constexpr float kMassScale = 1099511627776.0f;  // 2^40
inline constexpr int32_t kMaxVocab = int32_t{1} << 22;

__device__ __forceinline__ bool IsFinite(float z) {
  return fabsf(z) <= FLT_MAX;
}

// Order-preserving key of a finite logit: larger logit, larger key. -0 and
// +0 share a key, as they compare equal.
__device__ __forceinline__ uint32_t KeyOf(float z) {
  const uint32_t b = __float_as_uint(z == 0.0f ? 0.0f : z);
  return (b & 0x80000000u) != 0u ? ~b : (b | 0x80000000u);
}

// Best logit of a row so far, plus the counts the sampler needs.
struct Best {
  float z;           // largest candidate logit (-inf if none)
  int32_t id;        // lowest id holding it (INT32_MAX if none)
  uint32_t n_at;     // candidates equal to z
  uint32_t n_cand;   // candidates
  uint32_t key_min;  // smallest candidate key (0xFFFFFFFF if none)
};

__device__ __forceinline__ Best NoBest() {
  return {__int_as_float(static_cast<int>(0xFF800000u)), INT32_MAX, 0u, 0u,
          0xFFFFFFFFu};
}

// Associative, commutative combiners for BlockReduce.
struct MergeBest {
  __device__ Best operator()(const Best& a, const Best& b) const {
    Best r = a;
    if (b.z > a.z) {
      r.z = b.z;
      r.id = b.id;
      r.n_at = b.n_at;
    } else if (b.z == a.z) {
      r.id = min(a.id, b.id);
      r.n_at = a.n_at + b.n_at;
    }
    r.n_cand = a.n_cand + b.n_cand;
    r.key_min = min(a.key_min, b.key_min);
    return r;
  }
};
struct Add {
  __device__ uint64_t operator()(uint64_t a, uint64_t b) const { return a + b; }
};
struct Min {
  __device__ uint32_t operator()(uint32_t a, uint32_t b) const {
    return min(a, b);
  }
};

__device__ __forceinline__ uint64_t ShuffleXor(uint64_t v, int offset) {
  return __shfl_xor_sync(kFullMask, v, offset);
}
__device__ __forceinline__ uint32_t ShuffleXor(uint32_t v, int offset) {
  return __shfl_xor_sync(kFullMask, v, offset);
}
__device__ __forceinline__ Best ShuffleXor(const Best& v, int offset) {
  return {__shfl_xor_sync(kFullMask, v.z, offset),
          __shfl_xor_sync(kFullMask, v.id, offset),
          __shfl_xor_sync(kFullMask, v.n_at, offset),
          __shfl_xor_sync(kFullMask, v.n_cand, offset),
          __shfl_xor_sync(kFullMask, v.key_min, offset)};
}

// Reduces v over the block in a fixed tree; the result in every thread.
// buf: shared [kWarps], free again on return.
template <typename T, typename Op>
__device__ T BlockReduce(T v, T identity, Op op, T* buf) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = op(v, ShuffleXor(v, offset));
  }
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (lane == 0) buf[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarps ? buf[lane] : identity;
    for (int offset = 16; offset > 0; offset >>= 1) {
      v = op(v, ShuffleXor(v, offset));
    }
    if (lane == 0) buf[0] = v;
  }
  __syncthreads();
  const T result = buf[0];
  __syncthreads();
  return result;
}

// Shared memory of one block.
struct Shared {
  uint64_t mass_hist[kBins];
  uint32_t count_hist[kBins];
  Best best[kWarps];
  uint64_t sum[kWarps];
  uint32_t scan[kWarps];
  // Results of warp 0's scan of a histogram level.
  uint32_t found_bin;
  uint64_t found_before;
  uint64_t found_target;
};

// Block-wide best over row[0, vocab): candidates are the finite entries if
// finite_only, else every non-NaN entry. Result in every thread.
__device__ inline Best BlockBest(const float* row, int32_t vocab,
                                 bool finite_only, Shared& sh) {
  Best v = NoBest();
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
    float z = row[i];
    if (finite_only ? !IsFinite(z) : z != z) continue;
    if (z == 0.0f) z = 0.0f;
    v = MergeBest()(v, {z, i, 1u, 1u, IsFinite(z) ? KeyOf(z) : 0xFFFFFFFFu});
  }
  return BlockReduce(v, NoBest(), MergeBest(), sh.best);
}

// cudaErrorInvalidValue for a bad batch, vocab or null pointer with batch >
// 0; cudaSuccess otherwise (also for batch == 0).
inline cudaError_t CheckRows(const void* a, const void* b, const void* c,
                             int32_t batch, int32_t vocab) {
  if (batch < 0) return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  if (vocab < 1 || vocab > kMaxVocab) return cudaErrorInvalidValue;
  if (a == nullptr || b == nullptr || c == nullptr) {
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

}  // namespace baton::cuda::sampling_internal

#endif  // BATON_KERNELS_CUDA_SAMPLING_INTERNAL_H_
