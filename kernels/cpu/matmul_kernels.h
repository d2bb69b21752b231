// Internal to the MatMul kernels: the per-ISA kernel entry points and the
// reduction order every path implements.
//
// Reduction order (identical on every path, so the paths agree bit-for-bit):
// each output y[t][r] keeps 16 f32 lanes acc[0..15], all starting at +0.
//  * Quantized weights: blocks are taken in pairs (2p, 2p+1); block 2p feeds
//    lanes 0-7 and block 2p+1 lanes 8-15 (a missing last block feeds
//    nothing). For block b, lane j gets
//      acc = fma(float(sum_{i=4j}^{4j+3} qw[b][i] * qa[b][i]), dw[b] * da[b],
//      acc)
//    with qw the integer weight codes (Q4: 0..15, Q8: -128..127, Q6_K_R:
//    -32..31) and the integer sum exact; Q6_K_R has a scale per half block,
//    so lanes 0-3 of its block use dw = s0 and lanes 4-7 dw = s1. Q4_0, Q4_1
//    and Q4_K_R then add the block minimum term in 16 more lanes: accm[l] =
//    fma(m[b], sa[b], accm[l]) for b = l, l+16, ... (m = Q4_1's or Q4_K_R's
//    min, or -8 * d for Q4_0; sa = the activation block sum), and acc[l] +=
//    accm[l].
//  * F32/F16 weights: acc[l] = fma(w[i + l], x[i + l], acc[l]) for i = 0, 16,
//    32, ...
//  * y = Hsum16(acc): h8[j] = a[j] + a[j+8]; h4[j] = h8[j] + h8[j+4];
//    h2[j] = h4[j] + h4[j+2]; y = h2[0] + h2[1].
// fma is a single correctly rounded fused multiply-add (std::fma in the
// scalar path). None of this depends on the tile shape, the token's position
// in the batch or the thread partition.
#ifndef BATON_KERNELS_CPU_MATMUL_KERNELS_H_
#define BATON_KERNELS_CPU_MATMUL_KERNELS_H_

#include <cstdint>

#include "kernels/cpu/float16.h"
#include "kernels/cpu/quantize_activations.h"

namespace baton::matmul_internal {

// Byte layouts of one ggml block of 32 weights.
struct Q4_0Layout {  // f16 d, 16 bytes of nibbles: w = d * (q - 8)
  static constexpr int kBlockBytes = 18;
  static constexpr int kQsOffset = 2;
  static constexpr bool kHasMin = false;
  static constexpr bool kF32Scales = false;
  static constexpr bool kByteCodes = false;
};
struct Q4_1Layout {  // f16 d, f16 m, 16 bytes of nibbles: w = d * q + m
  static constexpr int kBlockBytes = 20;
  static constexpr int kQsOffset = 4;
  static constexpr bool kHasMin = true;
  static constexpr bool kF32Scales = false;
  static constexpr bool kByteCodes = false;
};
// Q4_K_R (tensor.h): f32 d, f32 m, 16 bytes of nibbles: w = d * q + m.
struct Q4_KRLayout {
  static constexpr int kBlockBytes = 24;
  static constexpr int kQsOffset = 8;
  static constexpr bool kHasMin = true;
  static constexpr bool kF32Scales = true;
  static constexpr bool kByteCodes = false;
};
// Q5_K_R (tensor.h): f32 d, f32 m, 32 codes 0..31 as bytes: w = d * q + m
// (the Q4 kernels with the codes loaded instead of unpacked).
struct Q5_KRLayout {
  static constexpr int kBlockBytes = 40;
  static constexpr int kQsOffset = 8;
  static constexpr bool kHasMin = true;
  static constexpr bool kF32Scales = true;
  static constexpr bool kByteCodes = true;
};
// d and m of a block of layout L, as f32.
template <typename L>
inline float BlockScale(const uint8_t* block, int which) {
  if constexpr (L::kF32Scales) {
    float v;
    __builtin_memcpy(&v, block + 4 * which, sizeof(v));
    return v;
  } else {
    uint16_t h;
    __builtin_memcpy(&h, block + 2 * which, sizeof(h));
    return F16ToF32(h);
  }
}
// Q8_0: f16 d, 32 int8: w = d * q.
inline constexpr int kQ8_0BlockBytes = 34;
// Q6_K_R (tensor.h): f32 s0, f32 s1, 32 int8: w = s_(i / 16) * q.
inline constexpr int kQ6_KRBlockBytes = 40;
inline constexpr int kQ6_KRQsOffset = 8;

// Rows [0, nrows) of a weight (row r starts at w + r * row_bytes) times
// tokens [t_begin, t_end) of x, written to y[t * ldy + r].
struct QuantArgs {
  const uint8_t* w;
  int64_t row_bytes;
  int64_t nrows;
  const Q8Activations* x;
  int64_t t_begin;
  int64_t t_end;
  float* y;
  int64_t ldy;
};
// As QuantArgs with x [tokens, k] f32 rows (x + t * k).
struct FloatArgs {
  const uint8_t* w;
  int64_t row_bytes;
  int64_t nrows;
  int64_t k;
  const float* x;
  int64_t t_begin;
  int64_t t_end;
  float* y;
  int64_t ldy;
};

struct KernelTable {
  void (*q4_0)(const QuantArgs&);
  void (*q4_1)(const QuantArgs&);
  void (*q8_0)(const QuantArgs&);
  void (*q4_kr)(const QuantArgs&);
  void (*q6_kr)(const QuantArgs&);
  void (*q5_kr)(const QuantArgs&);
  void (*f32)(const FloatArgs&);
  void (*f16)(const FloatArgs&);
};

const KernelTable& ScalarKernels();
// REQUIRES: the CPU supports the ISA (see cpu_features.h).
const KernelTable& Avx2Kernels();
const KernelTable& Avx512Kernels();
const KernelTable& Avx512VnniKernels();

}  // namespace baton::matmul_internal

#endif  // BATON_KERNELS_CPU_MATMUL_KERNELS_H_
