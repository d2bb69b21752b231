#include "kernels/cpu/paged_attention.h"

// GCC 12 reports its own AVX-512 intrinsics' deliberately undefined
// pass-through operands as maybe-uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <utility>
#include <vector>

#include "common/check.h"
#include "kernels/cpu/exp_approx.h"
#include "kernels/cpu/float16.h"

namespace baton {
namespace {

constexpr int kMaxGroup = 16;  // query heads per KV head
// The SIMD paths take the heads of up to kTileQueries queries at once (one
// KV head's rows of a prefill chunk share every K and V row they read).
constexpr int kTileQueries = 4;
constexpr int kMaxRows = kTileQueries * kMaxGroup;

// Loops over a row must unroll fully so their values live in registers.
#define BATON_UNROLL _Pragma("GCC unroll 16")

// The softmax's exp (exp_approx.h, degree 6): arguments are <= 0.
inline float ExpNonPositive(float x) { return exp_approx::Exp<6>(x); }

// The softmax's denominator, the n exps of a row summed in double in an
// order every path shares: eight partial sums, lane l adding s[8k + l] for
// k = 0, 1, ... over the whole groups of eight; then the lanes in a fixed
// tree, ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)); then the last n % 8 one
// by one. The SIMD paths hold the lanes in registers (one 8-lane register of
// doubles on AVX-512, two of 4 on AVX2) and give the same bits.
inline double LanesTree8(const double* lane) {
  const double t0 = lane[0] + lane[4], t1 = lane[1] + lane[5];
  const double t2 = lane[2] + lane[6], t3 = lane[3] + lane[7];
  return (t0 + t2) + (t1 + t3);
}

inline double SumExps(const float* s, int64_t n) {
  double lane[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int l = 0; l < 8; ++l) lane[l] += s[j + l];
  }
  double sum = LanesTree8(lane);
  for (; j < n; ++j) sum += s[j];
  return sum;
}

// The score order every path shares for head_dim a multiple of 16: 16
// lanes, lane l summing q[16 c + l] k[16 c + l] over c (a product, then
// fused multiply-adds), then a fixed tree: lanes l + 8 and l, then l + 4 and
// l, then 2 and 0 with 3 and 1, then those two. The AVX-512 path holds the
// lanes in one register, the AVX2 path in two, this one in an array; all
// three give the same bits.
inline float Reduce16(const float* lane) {
  float t[8], u[4];
  for (int l = 0; l < 8; ++l) t[l] = lane[l + 8] + lane[l];
  for (int l = 0; l < 4; ++l) u[l] = t[l + 4] + t[l];
  return (u[2] + u[0]) + (u[3] + u[1]);
}

inline float Dot16Lanes(const float* q, const uint16_t* k, int64_t d) {
  float lane[16];
  for (int l = 0; l < 16; ++l) lane[l] = q[l] * F16ToF32(k[l]);
  for (int64_t c = 16; c < d; c += 16) {
    for (int l = 0; l < 16; ++l)
      lane[l] = std::fma(q[c + l], F16ToF32(k[c + l]), lane[l]);
  }
  return Reduce16(lane);
}

// Attention for the heads of one KV group and one query position, scalar.
void GroupScalar(const float* const* qh, float* const* oh, int group,
                 int64_t n_keys, const PagedKvView& kv, int64_t g, float scale,
                 float* scores) {
  const int64_t d = kv.head_dim;
  const int64_t bs = kv.block_size;
  const int64_t head_stride = bs * d;
  for (int64_t j = 0; j < n_keys; ++j) {
    const uint16_t* k = kv.k_blocks[j / bs] + g * head_stride + (j % bs) * d;
    for (int h = 0; h < group; ++h) {
      float acc = 0.0f;
      if (d % 16 == 0) {
        acc = Dot16Lanes(qh[h], k, d);
      } else {
        for (int64_t i = 0; i < d; ++i)
          acc = std::fma(qh[h][i], F16ToF32(k[i]), acc);
      }
      scores[h * n_keys + j] = acc * scale;
    }
  }
  for (int h = 0; h < group; ++h) {
    float* s = scores + h * n_keys;
    float m = *std::max_element(s, s + n_keys);
    for (int64_t j = 0; j < n_keys; ++j) s[j] = ExpNonPositive(s[j] - m);
    const float inv = static_cast<float>(1.0 / SumExps(s, n_keys));
    for (int64_t i = 0; i < d; ++i) oh[h][i] = 0.0f;
    for (int64_t j = 0; j < n_keys; ++j) {
      const uint16_t* v = kv.v_blocks[j / bs] + g * head_stride + (j % bs) * d;
      const float p = s[j] * inv;
      for (int64_t i = 0; i < d; ++i)
        oh[h][i] = std::fma(p, F16ToF32(v[i]), oh[h][i]);
    }
  }
}

#if defined(__x86_64__)
#define BATON_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))

BATON_AVX512 inline __m512 Exp16(__m512 x) { return exp_approx::Exp16<6>(x); }

// Reduce16's tree on one register (not _mm512_reduce_add_ps, whose order
// is the compiler's).
BATON_AVX512 inline float Reduce16(__m512 acc) {
  const __m256 hi =
      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1));
  const __m256 t = _mm256_add_ps(hi, _mm512_castps512_ps256(acc));
  const __m128 u =
      _mm_add_ps(_mm256_extractf128_ps(t, 1), _mm256_castps256_ps128(t));
  const __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));  // u2 + u0, u3 + u1
  return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}

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
  double sum = LanesTree8(lane);
  for (; j < n; ++j) sum += s[j];
  return sum;
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

using GroupFn = void (*)(const float* const*, float* const*, const int64_t*,
                         int, const PagedKvView&, int64_t, float, float*);

// GroupAvx512<head_dim / 16>; head_dim a multiple of 16, at most 256.
template <int... NV>
constexpr GroupFn Avx512For(int64_t nv, std::integer_sequence<int, NV...>) {
  GroupFn fn = nullptr;
  ((fn = nv == NV + 1 ? &GroupAvx512<NV + 1> : fn), ...);
  return fn;
}
GroupFn GroupAvx512For(int64_t head_dim) {
  return Avx512For(head_dim / 16, std::make_integer_sequence<int, 16>{});
}

#define BATON_AVX2 __attribute__((target("avx2,fma,f16c")))

BATON_AVX2 inline __m256 Exp8(__m256 x) { return exp_approx::Exp8<6>(x); }

// Reduce16's tree on lanes 0-7 (lo) and 8-15 (hi).
BATON_AVX2 inline float Reduce16(__m256 lo, __m256 hi) {
  const __m256 t = _mm256_add_ps(hi, lo);
  const __m128 u =
      _mm_add_ps(_mm256_extractf128_ps(t, 1), _mm256_castps256_ps128(t));
  const __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
  return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}

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
  double sum = LanesTree8(lane);
  for (; j < n; ++j) sum += s[j];
  return sum;
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
  constexpr int kChunk = std::min(8, 2 * NV);  // registers of a row at once
  for (int64_t j0 = 0; j0 < stride; j0 += 16) {
    RowsToFloats256<NV>(kv.v_blocks, g, bs, j0, 16, stride, kv16);
    for (int r = 0; r < rows; ++r) {
      const int64_t n = std::min<int64_t>(16, n_keys[r] - j0);
      if (n <= 0) continue;
      const float* p = scores + r * stride + j0;
      float* o = oh[r];
      for (int c0 = 0; c0 < 2 * NV; c0 += kChunk) {
        __m256 acc[kChunk];
        BATON_UNROLL
        for (int c = 0; c < kChunk; ++c) {
          acc[c] =
              j0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(o + 8 * (c0 + c));
        }
        for (int64_t t = 0; t < n; ++t) {
          const __m256 pt = _mm256_set1_ps(p[t]);
          BATON_UNROLL
          for (int c = 0; c < kChunk; ++c) {
            acc[c] = _mm256_fmadd_ps(pt, _mm256_load_ps(kv16[t] + 8 * (c0 + c)),
                                     acc[c]);
          }
        }
        BATON_UNROLL
        for (int c = 0; c < kChunk; ++c) {
          _mm256_storeu_ps(o + 8 * (c0 + c), acc[c]);
        }
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
GroupFn GroupAvx2For(int64_t head_dim) {
  return Avx2For(head_dim / 16, std::make_integer_sequence<int, 16>{});
}
#endif

}  // namespace

void PagedAttention(const float* q, int64_t num_queries, int64_t start_pos,
                    const AttentionShape& shape, const PagedKvView& kv,
                    float* out, CpuIsa isa) {
  BATON_CHECK_GT(kv.num_kv_heads, 0);
  BATON_CHECK_EQ(shape.num_heads % kv.num_kv_heads, 0);
  const int group = static_cast<int>(shape.num_heads / kv.num_kv_heads);
  BATON_CHECK_LE(group, kMaxGroup);
  const int64_t d = kv.head_dim;
  const int64_t max_keys = start_pos + num_queries;
  BATON_CHECK_LE((max_keys + kv.block_size - 1) / kv.block_size,
                 static_cast<int64_t>(kv.k_blocks.size()));
  thread_local std::vector<float> scratch;  // [rows][n_keys] scores
  scratch.resize(static_cast<size_t>(kTileQueries * group * max_keys));
  float* scores = scratch.data();
  const bool lanes16 = d % 16 == 0 && d <= 256;
  GroupFn simd = nullptr;
#if defined(__x86_64__)
  if ((isa == CpuIsa::kAvx512 || isa == CpuIsa::kAvx512Vnni) && lanes16) {
    simd = GroupAvx512For(d);
  } else if (isa == CpuIsa::kAvx2 && lanes16) {
    simd = GroupAvx2For(d);
  }
#endif
  const float* qh[kMaxRows];
  float* oh[kMaxRows];
  int64_t n_keys[kMaxRows];
  if (simd != nullptr) {
    // The heads of kTileQueries queries of one KV head at a time.
    for (int64_t g = 0; g < kv.num_kv_heads; ++g) {
      for (int64_t i0 = 0; i0 < num_queries; i0 += kTileQueries) {
        const int64_t queries =
            std::min<int64_t>(kTileQueries, num_queries - i0);
        int rows = 0;
        for (int64_t i = i0; i < i0 + queries; ++i) {
          for (int h = 0; h < group; ++h, ++rows) {
            const int64_t head = g * group + h;
            qh[rows] = q + (i * shape.num_heads + head) * d;
            oh[rows] = out + (i * shape.num_heads + head) * d;
            n_keys[rows] = start_pos + i + 1;
          }
        }
        simd(qh, oh, n_keys, rows, kv, g, shape.scale, scores);
      }
    }
    return;
  }
  for (int64_t i = 0; i < num_queries; ++i) {
    for (int64_t g = 0; g < kv.num_kv_heads; ++g) {
      for (int h = 0; h < group; ++h) {
        const int64_t head = g * group + h;
        qh[h] = q + (i * shape.num_heads + head) * d;
        oh[h] = out + (i * shape.num_heads + head) * d;
      }
      GroupScalar(qh, oh, group, start_pos + i + 1, kv, g, shape.scale, scores);
    }
  }
}

}  // namespace baton
