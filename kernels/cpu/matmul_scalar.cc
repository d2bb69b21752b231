// Portable MatMul kernels; the reference for the reduction order described in
// matmul_kernels.h (the SIMD paths must match them bit-for-bit).
#include <cmath>
#include <cstring>

#include "kernels/cpu/float16.h"
#include "kernels/cpu/matmul_kernels.h"

namespace baton::matmul_internal {
namespace {

constexpr int kLanes = 16;

float Hsum16(const float* a) {
  float h8[8], h4[4];
  for (int j = 0; j < 8; ++j) h8[j] = a[j] + a[j + 8];
  for (int j = 0; j < 4; ++j) h4[j] = h8[j] + h8[j + 4];
  const float h2a = h4[0] + h4[2];
  const float h2b = h4[1] + h4[3];
  return h2a + h2b;
}

uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Integer codes of one block in activation order.
template <typename L>
void DecodeQ4(const uint8_t* block, int32_t* q) {
  const uint8_t* qs = block + L::kQsOffset;
  if constexpr (L::kByteCodes) {
    for (int i = 0; i < 32; ++i) q[i] = qs[i];
    return;
  }
  for (int i = 0; i < 16; ++i) {
    q[i] = qs[i] & 0x0f;
    q[i + 16] = qs[i] >> 4;
  }
}

// Adds one block's contribution to lanes [lane0, lane0 + 8): lanes 0-3
// scaled by scale_lo, 4-7 by scale_hi.
void AccumulateBlock(const int32_t* qw, const int8_t* qa, float scale_lo,
                     float scale_hi, float* acc) {
  for (int j = 0; j < 8; ++j) {
    int32_t s = 0;
    for (int i = 4 * j; i < 4 * j + 4; ++i) s += qw[i] * qa[i];
    acc[j] =
        std::fma(static_cast<float>(s), j < 4 ? scale_lo : scale_hi, acc[j]);
  }
}
void AccumulateBlock(const int32_t* qw, const int8_t* qa, float scale,
                     float* acc) {
  AccumulateBlock(qw, qa, scale, scale, acc);
}

template <typename L>
void Q4Rows(const QuantArgs& a) {
  const int64_t nb = a.x->blocks_per_token();
  int32_t q[32];
  for (int64_t r = 0; r < a.nrows; ++r) {
    const uint8_t* row = a.w + r * a.row_bytes;
    for (int64_t t = a.t_begin; t < a.t_end; ++t) {
      const int8_t* qa = a.x->quants(t);
      const float* da = a.x->scales(t);
      const float* sa = a.x->sums(t);
      float acc[kLanes] = {};
      float accm[kLanes] = {};
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* block = row + b * L::kBlockBytes;
        const float d = BlockScale<L>(block, 0);
        const float m = L::kHasMin ? BlockScale<L>(block, 1) : -8.0f * d;
        DecodeQ4<L>(block, q);
        AccumulateBlock(q, qa + b * 32, d * da[b], acc + 8 * (b & 1));
        accm[b % kLanes] = std::fma(m, sa[b], accm[b % kLanes]);
      }
      for (int l = 0; l < kLanes; ++l) acc[l] += accm[l];
      a.y[t * a.ldy + r] = Hsum16(acc);
    }
  }
}

// Weights with int8 codes: Q8_0 (one f16 scale a block) and, with
// kHalfScales, Q6_K_R (f32 scales of each half block).
template <bool kHalfScales>
void Q8Rows(const QuantArgs& a) {
  constexpr int kBytes = kHalfScales ? kQ6_KRBlockBytes : kQ8_0BlockBytes;
  constexpr int kQs = kHalfScales ? kQ6_KRQsOffset : 2;
  const int64_t nb = a.x->blocks_per_token();
  int32_t q[32];
  for (int64_t r = 0; r < a.nrows; ++r) {
    const uint8_t* row = a.w + r * a.row_bytes;
    for (int64_t t = a.t_begin; t < a.t_end; ++t) {
      const int8_t* qa = a.x->quants(t);
      const float* da = a.x->scales(t);
      float acc[kLanes] = {};
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* block = row + b * kBytes;
        float s[2];
        if constexpr (kHalfScales) {
          std::memcpy(s, block, sizeof(s));
        } else {
          s[0] = s[1] = F16ToF32(LoadU16(block));
        }
        for (int i = 0; i < 32; ++i) q[i] = static_cast<int8_t>(block[kQs + i]);
        AccumulateBlock(q, qa + b * 32, s[0] * da[b], s[1] * da[b],
                        acc + 8 * (b & 1));
      }
      a.y[t * a.ldy + r] = Hsum16(acc);
    }
  }
}

template <bool kF16>
void FloatRows(const FloatArgs& a) {
  for (int64_t r = 0; r < a.nrows; ++r) {
    const uint8_t* row = a.w + r * a.row_bytes;
    for (int64_t t = a.t_begin; t < a.t_end; ++t) {
      const float* x = a.x + t * a.k;
      float acc[kLanes] = {};
      for (int64_t i = 0; i < a.k; i += kLanes) {
        for (int l = 0; l < kLanes; ++l) {
          float w;
          if constexpr (kF16) {
            w = F16ToF32(LoadU16(row + 2 * (i + l)));
          } else {
            std::memcpy(&w, row + 4 * (i + l), sizeof(w));
          }
          acc[l] = std::fma(w, x[i + l], acc[l]);
        }
      }
      a.y[t * a.ldy + r] = Hsum16(acc);
    }
  }
}

}  // namespace

const KernelTable& ScalarKernels() {
  static constexpr KernelTable kTable = {
      &Q4Rows<Q4_0Layout>,  &Q4Rows<Q4_1Layout>, &Q8Rows<false>,
      &Q4Rows<Q4_KRLayout>, &Q8Rows<true>,       &Q4Rows<Q5_KRLayout>,
      &FloatRows<false>,    &FloatRows<true>,
  };
  return kTable;
}

}  // namespace baton::matmul_internal
