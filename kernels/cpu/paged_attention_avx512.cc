// The AVX-512 path of the CPU attention kernel (paged_attention_internal.h).
#include "kernels/cpu/paged_attention_internal.h"

#if defined(__x86_64__)

// GCC 12 reports its own AVX-512 intrinsics' deliberately undefined
// pass-through operands as maybe-uninitialized.
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

#define BATON_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))

BATON_AVX512 inline __m512 Exp16(__m512 x) { return exp_approx::Exp16<6>(x); }

// Reduce16 of 16 accumulators at once: lane t of the result is
// Reduce16(a[t]), with the same additions on the same operands (the tree's
// first level adds the upper and lower halves of two accumulators in one
// register, the second their quarters, the third pairs inside a quarter), so
// the bits are those of 16 separate Reduce16 calls, in about a sixth of the
// instructions.
BATON_AVX512 inline __m512 Reduce16x16(const __m512* a) {
  __m512 x[8];  // x[p]: lanes 0-7 t8 of a[2p], lanes 8-15 t8 of a[2p + 1]
  for (int p = 0; p < 8; ++p) {
    const __m512 lo = _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0x44);
    const __m512 hi = _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0xEE);
    x[p] = _mm512_add_ps(hi, lo);  // t8[l] = lane[l + 8] + lane[l]
  }
  __m512 y[4];  // y[p]: quarter k holds u[0..3] of a[4p + k]
  for (int p = 0; p < 4; ++p) {
    const __m512 lo = _mm512_shuffle_f32x4(x[2 * p], x[2 * p + 1], 0x88);
    const __m512 hi = _mm512_shuffle_f32x4(x[2 * p], x[2 * p + 1], 0xDD);
    y[p] = _mm512_add_ps(hi, lo);  // u[l] = t8[l + 4] + t8[l]
  }
  __m512 z[2];  // z[p], quarter k: u2 + u0, u3 + u1 of a[8p + k], a[8p + 4 + k]
  for (int p = 0; p < 2; ++p) {
    const __m512 lo = _mm512_shuffle_ps(y[2 * p], y[2 * p + 1], 0x44);
    const __m512 hi = _mm512_shuffle_ps(y[2 * p], y[2 * p + 1], 0xEE);
    z[p] = _mm512_add_ps(hi, lo);
  }
  // Quarter k: (u2 + u0) + (u3 + u1) of a[k], a[4 + k], a[8 + k], a[12 + k].
  const __m512 even = _mm512_shuffle_ps(z[0], z[1], 0x88);
  const __m512 odd = _mm512_shuffle_ps(z[0], z[1], 0xDD);
  const __m512 r = _mm512_add_ps(even, odd);
  // Lane 4k + e holds a[4e + k]: back to lane t for a[t].
  const __m512i order =
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, r);
}

// SumExps with the eight lanes in one register.
BATON_AVX512 inline double SumExps512(const float* s, int64_t n) {
  __m512d acc = _mm512_setzero_pd();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_loadu_ps(s + j)));
  }
  alignas(64) double lane[8];
  _mm512_store_pd(lane, acc);
  return FinishSumExps(lane, s, j, n);
}

// Rows j0 .. j0 + 15 of KV head g of one layer's K or V blocks, as floats
// (zeros from row `end` on).
template <int NV>
BATON_AVX512 void RowsToFloats512(std::span<const uint16_t* const> blocks,
                                  int64_t g, int64_t bs, int64_t j0,
                                  int64_t end, float (*dst)[16 * NV]) {
  constexpr int64_t d = 16 * NV;
  for (int64_t t = 0; t < 16; ++t) {
    const int64_t j = j0 + t;
    if (j >= end) {
      BATON_UNROLL
      for (int c = 0; c < NV; ++c) {
        _mm512_store_ps(dst[t] + 16 * c, _mm512_setzero_ps());
      }
      continue;
    }
    const uint16_t* x = blocks[j / bs] + g * bs * d + (j % bs) * d;
    BATON_UNROLL
    for (int c = 0; c < NV; ++c) {
      _mm512_store_ps(dst[t] + 16 * c,
                      _mm512_cvtph_ps(_mm256_loadu_si256(
                          reinterpret_cast<const __m256i*>(x + 16 * c))));
    }
  }
}

// The attention of `rows` query rows of one KV head g (the heads of up to
// kTileQueries queries), row r over keys [0, n_keys[r]), head_dim = 16 NV
// (NV <= 16). Every row gets the operations of one row alone, in the same
// order; the rows only share loading and converting K and V. NV is a
// template argument so every loop over a row unrolls and the accumulators
// stay in registers. `scores` holds rows x max(n_keys) floats.
template <int NV>
BATON_AVX512 void GroupAvx512(const float* const* qh, float* const* oh,
                              const int64_t* n_keys, int rows,
                              const PagedKvView& kv, int64_t g, float scale,
                              float* scores) {
  constexpr int64_t d = 16 * NV;
  const int64_t bs = kv.block_size;
  int64_t stride = 0;
  for (int r = 0; r < rows; ++r) stride = std::max(stride, n_keys[r]);
  // Sixteen K (then V) rows in floats; zeros past the last key.
  alignas(64) float kv16[16][d];
  // Scores sixteen keys at a time: each row's 16 dot products, one batched
  // reduction.
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t j0 = 0; j0 < stride; j0 += 16) {
    RowsToFloats512<NV>(kv.k_blocks, g, bs, j0, stride, kv16);
    for (int r = 0; r < rows; ++r) {
      const int64_t n = std::min<int64_t>(16, n_keys[r] - j0);
      if (n <= 0) continue;
      const float* q = qh[r];
      __m512 acc[16];
      BATON_UNROLL
      for (int t = 0; t < 16; ++t) {
        acc[t] = _mm512_mul_ps(_mm512_loadu_ps(q), _mm512_load_ps(kv16[t]));
      }
      BATON_UNROLL
      for (int c = 1; c < NV; ++c) {
        const __m512 qc = _mm512_loadu_ps(q + 16 * c);
        BATON_UNROLL
        for (int t = 0; t < 16; ++t) {
          acc[t] =
              _mm512_fmadd_ps(qc, _mm512_load_ps(kv16[t] + 16 * c), acc[t]);
        }
      }
      _mm512_mask_storeu_ps(scores + r * stride + j0,
                            static_cast<__mmask16>((1u << n) - 1),
                            _mm512_mul_ps(Reduce16x16(acc), vscale));
    }
  }
  for (int r = 0; r < rows; ++r) {
    float* s = scores + r * stride;
    const int64_t n_keys_r = n_keys[r];
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 16 <= n_keys_r; j += 16)
      vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(s + j));
    float m = _mm512_reduce_max_ps(vmax);
    for (; j < n_keys_r; ++j) m = std::max(m, s[j]);
    __m512 vm = _mm512_set1_ps(m);
    j = 0;
    for (; j + 16 <= n_keys_r; j += 16) {
      _mm512_storeu_ps(s + j, Exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), vm)));
    }
    if (j < n_keys_r) {
      __mmask16 mask = static_cast<__mmask16>((1u << (n_keys_r - j)) - 1);
      __m512 e = Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, s + j), vm));
      _mm512_mask_storeu_ps(s + j, mask, e);
    }
  }
  for (int r = 0; r < rows; ++r) {
    float* s = scores + r * stride;
    const int64_t n_keys_r = n_keys[r];
    const __m512 inv =
        _mm512_set1_ps(static_cast<float>(1.0 / SumExps512(s, n_keys_r)));
    int64_t j = 0;
    for (; j + 16 <= n_keys_r; j += 16) {
      __m512 p = _mm512_mul_ps(_mm512_loadu_ps(s + j), inv);
      _mm512_storeu_ps(s + j, p);
    }
    if (j < n_keys_r) {
      __mmask16 mask = static_cast<__mmask16>((1u << (n_keys_r - j)) - 1);
      __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, s + j), inv);
      _mm512_mask_storeu_ps(s + j, mask, p);
    }
  }
  // The weighted sum, sixteen V rows at a time: each row's accumulators
  // start at zero and add its keys in order; between blocks they wait in
  // its output row (an exact round trip).
  for (int64_t j0 = 0; j0 < stride; j0 += 16) {
    RowsToFloats512<NV>(kv.v_blocks, g, bs, j0, stride, kv16);
    for (int r = 0; r < rows; ++r) {
      const int64_t n = std::min<int64_t>(16, n_keys[r] - j0);
      if (n <= 0) continue;
      float* o = oh[r];
      const float* p = scores + r * stride + j0;
      __m512 acc[NV];
      BATON_UNROLL
      for (int c = 0; c < NV; ++c) {
        acc[c] = j0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(o + 16 * c);
      }
      for (int64_t t = 0; t < n; ++t) {
        const __m512 pt = _mm512_set1_ps(p[t]);
        BATON_UNROLL
        for (int c = 0; c < NV; ++c) {
          acc[c] =
              _mm512_fmadd_ps(pt, _mm512_load_ps(kv16[t] + 16 * c), acc[c]);
        }
      }
      BATON_UNROLL
      for (int c = 0; c < NV; ++c) _mm512_storeu_ps(o + 16 * c, acc[c]);
    }
  }
}

// GroupAvx512<head_dim / 16>; head_dim a multiple of 16, at most 256.
template <int... NV>
constexpr GroupFn Avx512For(int64_t nv, std::integer_sequence<int, NV...>) {
  GroupFn fn = nullptr;
  ((fn = nv == NV + 1 ? &GroupAvx512<NV + 1> : fn), ...);
  return fn;
}

}  // namespace

GroupFn GroupAvx512For(int64_t head_dim) {
  if (head_dim % 16 != 0) return nullptr;
  return Avx512For(head_dim / 16, std::make_integer_sequence<int, 16>{});
}

}  // namespace baton::attention_internal

#endif  // defined(__x86_64__)
