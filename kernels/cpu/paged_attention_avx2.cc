// The AVX2 path of the CPU attention kernel (paged_attention_internal.h).
#include "kernels/cpu/paged_attention_internal.h"

#if defined(__x86_64__)

// GCC 12 reports its own intrinsics' deliberately undefined pass-through
// operands as maybe-uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <utility>

#include "kernels/cpu/float16.h"

namespace baton::attention_internal {
namespace {

// Loops over a row must unroll fully so their values live in registers.
#define BATON_UNROLL _Pragma("GCC unroll 16")

#define BATON_AVX2 __attribute__((target("avx2,fma,f16c")))

BATON_AVX2 inline __m256 Exp8(__m256 x) { return exp_approx::Exp8<6>(x); }

BATON_AVX2 inline __m256 LoadHalves8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Reduce16 of four accumulators (lanes 0-7 in lo[t], 8-15 in hi[t]) at
// once: element t is Reduce16(lo[t], hi[t]), the same additions on the same
// operands as four separate calls.
BATON_AVX2 inline __m128 Reduce16x4(const __m256* lo, const __m256* hi) {
  __m256 t8[4];  // t8[l] = lane[l + 8] + lane[l]
  for (int t = 0; t < 4; ++t) t8[t] = _mm256_add_ps(hi[t], lo[t]);
  __m256 u[2];  // half k of u[p]: u[0..3] of accumulator 2p + k
  for (int p = 0; p < 2; ++p) {
    const __m256 l = _mm256_permute2f128_ps(t8[2 * p], t8[2 * p + 1], 0x20);
    const __m256 h = _mm256_permute2f128_ps(t8[2 * p], t8[2 * p + 1], 0x31);
    u[p] = _mm256_add_ps(h, l);  // u[l] = t8[l + 4] + t8[l]
  }
  // Half k: u2 + u0, u3 + u1 of accumulators k and 2 + k.
  const __m256 z = _mm256_add_ps(_mm256_shuffle_ps(u[0], u[1], 0xEE),
                                 _mm256_shuffle_ps(u[0], u[1], 0x44));
  // Half k: (u2 + u0) + (u3 + u1) of accumulators k, 2 + k (twice).
  const __m256 r = _mm256_add_ps(_mm256_shuffle_ps(z, z, 0x88),
                                 _mm256_shuffle_ps(z, z, 0xDD));
  return _mm_unpacklo_ps(_mm256_castps256_ps128(r),
                         _mm256_extractf128_ps(r, 1));
}

// SumExps with lanes 0-3 in one register and 4-7 in another.
BATON_AVX2 inline double SumExps256(const float* s, int64_t n) {
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm_loadu_ps(s + j)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm_loadu_ps(s + j + 4)));
  }
  alignas(32) double lane[8];
  _mm256_store_pd(lane, lo);
  _mm256_store_pd(lane + 4, hi);
  return FinishSumExps(lane, s, j, n);
}

// Rows j0 .. j0 + count - 1 of KV head g of one layer's K or V blocks, as
// floats (zeros from row `end` on).
template <int NV>
BATON_AVX2 void RowsToFloats256(std::span<const uint16_t* const> blocks,
                                int64_t g, int64_t bs, int64_t j0,
                                int64_t count, int64_t end,
                                float (*dst)[16 * NV]) {
  constexpr int64_t d = 16 * NV;
  for (int64_t t = 0; t < count; ++t) {
    const int64_t j = j0 + t;
    if (j >= end) {
      BATON_UNROLL
      for (int c = 0; c < 2 * NV; ++c) {
        _mm256_store_ps(dst[t] + 8 * c, _mm256_setzero_ps());
      }
      continue;
    }
    const uint16_t* x = blocks[j / bs] + g * bs * d + (j % bs) * d;
    BATON_UNROLL
    for (int c = 0; c < 2 * NV; ++c) {
      _mm256_store_ps(dst[t] + 8 * c, LoadHalves8(x + 8 * c));
    }
  }
}

// Registers [c0, c0 + kC) of one row's output, eight floats each: adds the
// weighted sum of V rows 0..n-1 in key order, from +0 when `first`, else
// from what the row's output holds (an exact round trip).
template <int NV, int kC>
BATON_AVX2 inline void WeightedSumChunk(const float* p, int64_t n,
                                        const float (*kv16)[16 * NV],
                                        bool first, float* o, int c0) {
  __m256 acc[kC];
  BATON_UNROLL
  for (int c = 0; c < kC; ++c) {
    acc[c] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(o + 8 * (c0 + c));
  }
  for (int64_t t = 0; t < n; ++t) {
    const __m256 pt = _mm256_set1_ps(p[t]);
    BATON_UNROLL
    for (int c = 0; c < kC; ++c) {
      acc[c] =
          _mm256_fmadd_ps(pt, _mm256_load_ps(kv16[t] + 8 * (c0 + c)), acc[c]);
    }
  }
  BATON_UNROLL
  for (int c = 0; c < kC; ++c) _mm256_storeu_ps(o + 8 * (c0 + c), acc[c]);
}

// GroupAvx512 on 8-lane registers, two per 16 dims (head_dim = 16 NV): the
// same operations in the same order, so the same bits. Scores four keys at
// a time; the weighted sum sixteen keys at a time, up to 64 dims of a row's
// accumulators in registers.
template <int NV>
BATON_AVX2 void GroupAvx2(const float* const* qh, float* const* oh,
                          const int64_t* n_keys, int rows,
                          const PagedKvView& kv, int64_t g, float scale,
                          float* scores) {
  constexpr int64_t d = 16 * NV;
  const int64_t bs = kv.block_size;
  int64_t stride = 0;
  for (int r = 0; r < rows; ++r) stride = std::max(stride, n_keys[r]);
  alignas(32) float kv16[16][d];  // K (4 rows) or V (16 rows) in floats
  const __m128 vscale = _mm_set1_ps(scale);
  for (int64_t j0 = 0; j0 < stride; j0 += 4) {
    RowsToFloats256<NV>(kv.k_blocks, g, bs, j0, 4, stride, kv16);
    for (int r = 0; r < rows; ++r) {
      const int64_t n = std::min<int64_t>(4, n_keys[r] - j0);
      if (n <= 0) continue;
      const float* q = qh[r];
      __m256 lo[4], hi[4];
      BATON_UNROLL
      for (int t = 0; t < 4; ++t) {
        lo[t] = _mm256_mul_ps(_mm256_loadu_ps(q), _mm256_load_ps(kv16[t]));
        hi[t] =
            _mm256_mul_ps(_mm256_loadu_ps(q + 8), _mm256_load_ps(kv16[t] + 8));
      }
      BATON_UNROLL
      for (int c = 1; c < NV; ++c) {
        const __m256 ql = _mm256_loadu_ps(q + 16 * c);
        const __m256 qh8 = _mm256_loadu_ps(q + 16 * c + 8);
        BATON_UNROLL
        for (int t = 0; t < 4; ++t) {
          lo[t] = _mm256_fmadd_ps(ql, _mm256_load_ps(kv16[t] + 16 * c), lo[t]);
          hi[t] =
              _mm256_fmadd_ps(qh8, _mm256_load_ps(kv16[t] + 16 * c + 8), hi[t]);
        }
      }
      alignas(16) float out4[4];
      _mm_store_ps(out4, _mm_mul_ps(Reduce16x4(lo, hi), vscale));
      for (int64_t t = 0; t < n; ++t) scores[r * stride + j0 + t] = out4[t];
    }
  }
  for (int r = 0; r < rows; ++r) {
    float* s = scores + r * stride;
    const int64_t n_keys_r = n_keys[r];
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 8 <= n_keys_r; j += 8)
      vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + j));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vmax);
    float m = *std::max_element(lanes, lanes + 8);
    for (; j < n_keys_r; ++j) m = std::max(m, s[j]);
    const __m256 vm = _mm256_set1_ps(m);
    j = 0;
    for (; j + 8 <= n_keys_r; j += 8) {
      _mm256_storeu_ps(s + j, Exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm)));
    }
    for (; j < n_keys_r; ++j) s[j] = ExpNonPositive(s[j] - m);
  }
  for (int r = 0; r < rows; ++r) {
    float* s = scores + r * stride;
    const int64_t n_keys_r = n_keys[r];
    const float inv_f = static_cast<float>(1.0 / SumExps256(s, n_keys_r));
    const __m256 inv = _mm256_set1_ps(inv_f);
    int64_t j = 0;
    for (; j + 8 <= n_keys_r; j += 8) {
      _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_loadu_ps(s + j), inv));
    }
    for (; j < n_keys_r; ++j) s[j] = s[j] * inv_f;
  }
  // Each row's accumulators start at zero and add its keys in order; they
  // wait in its output row between blocks of keys (an exact round trip).
  // A row's 2 NV registers, at most eight at once: full chunks of eight,
  // then the rest (2 NV = 10 for head_dim 80: 8 + 2).
  constexpr int kChunk = std::min(8, 2 * NV);
  constexpr int kFull = 2 * NV / kChunk * kChunk;
  for (int64_t j0 = 0; j0 < stride; j0 += 16) {
    RowsToFloats256<NV>(kv.v_blocks, g, bs, j0, 16, stride, kv16);
    for (int r = 0; r < rows; ++r) {
      const int64_t n = std::min<int64_t>(16, n_keys[r] - j0);
      if (n <= 0) continue;
      const float* p = scores + r * stride + j0;
      float* o = oh[r];
      for (int c0 = 0; c0 < kFull; c0 += kChunk) {
        WeightedSumChunk<NV, kChunk>(p, n, kv16, j0 == 0, o, c0);
      }
      if constexpr (kFull < 2 * NV) {
        WeightedSumChunk<NV, 2 * NV - kFull>(p, n, kv16, j0 == 0, o, kFull);
      }
    }
  }
}

template <int... NV>
constexpr GroupFn Avx2For(int64_t nv, std::integer_sequence<int, NV...>) {
  GroupFn fn = nullptr;
  ((fn = nv == NV + 1 ? &GroupAvx2<NV + 1> : fn), ...);
  return fn;
}

}  // namespace

GroupFn GroupAvx2For(int64_t head_dim) {
  if (head_dim % 16 != 0) return nullptr;
  return Avx2For(head_dim / 16, std::make_integer_sequence<int, 16>{});
}

}  // namespace baton::attention_internal

#endif  // defined(__x86_64__)
