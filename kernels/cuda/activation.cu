#include <cstdint>

#include "kernels/cuda/activation.h"
#include "kernels/cuda/cuda_check.h"

namespace baton::cuda {
namespace {

constexpr int kThreads = 256;
// Work beyond kThreads * kMaxBlocks float4s is handled by a grid-stride loop.
constexpr int64_t kMaxBlocks = 1 << 16;

enum class Op : int { kSwiGlu, kAdd };

__device__ __forceinline__ float Apply(Op op, float a, float b) {
  if (op == Op::kSwiGlu) {
    return __fmul_rn(__fdiv_rn(a, __fadd_rn(1.0f, expf(-a))), b);
  }
  return __fadd_rn(a, b);
}

// out[i] = Apply(op, a[i], b[i]). The first `vec_n` * 4 elements are read and
// written as float4 (all three pointers are 16-byte aligned then), the rest
// one at a time. Each element is read before it is written by the same
// thread, so out may alias a or b exactly.
__global__ void BinaryKernel(Op op, const float* a, const float* b, int64_t n,
                             int64_t vec_n, float* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first =
      static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t v = first; v < vec_n; v += stride) {
    const float4 av = reinterpret_cast<const float4*>(a)[v];
    const float4 bv = reinterpret_cast<const float4*>(b)[v];
    float4 r;
    r.x = Apply(op, av.x, bv.x);
    r.y = Apply(op, av.y, bv.y);
    r.z = Apply(op, av.z, bv.z);
    r.w = Apply(op, av.w, bv.w);
    reinterpret_cast<float4*>(out)[v] = r;
  }
  for (int64_t i = vec_n * 4 + first; i < n; i += stride) {
    out[i] = Apply(op, a[i], b[i]);
  }
}

bool Aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

cudaError_t Launch(Op op, const float* a, const float* b, int64_t n, float* out,
                   cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (a == nullptr || b == nullptr || out == nullptr) {
    return cudaErrorInvalidValue;
  }
  const bool vector = Aligned16(a) && Aligned16(b) && Aligned16(out);
  const int64_t vec_n = vector ? n / 4 : 0;
  // Threads needed: one per float4 plus one per leftover element.
  const int64_t work = vec_n + (n - vec_n * 4);
  const int64_t needed = (work + kThreads - 1) / kThreads;
  const unsigned blocks =
      static_cast<unsigned>(needed < kMaxBlocks ? needed : kMaxBlocks);
  BinaryKernel<<<blocks, kThreads, 0, stream>>>(op, a, b, n, vec_n, out);
  BATON_CUDA_RETURN_LAUNCH_ERROR();
}

}  // namespace

cudaError_t SwiGlu(const float* gate, const float* up, int64_t n, float* out,
                   cudaStream_t stream) {
  return Launch(Op::kSwiGlu, gate, up, n, out, stream);
}

cudaError_t AddInPlace(float* x, const float* y, int64_t n,
                       cudaStream_t stream) {
  return Launch(Op::kAdd, x, y, n, x, stream);
}

}  // namespace baton::cuda
