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
#include <vector>

#include "common/check.h"
#include "kernels/cpu/exp_approx.h"
#include "kernels/cpu/float16.h"

namespace baton {
namespace {

constexpr int kMaxGroup = 16;  // query heads per KV head handled together

// The softmax's exp (exp_approx.h, degree 6): arguments are <= 0.
inline float ExpNonPositive(float x) { return exp_approx::Exp<6>(x); }

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
    double sum = 0.0;
    for (int64_t j = 0; j < n_keys; ++j) {
      s[j] = ExpNonPositive(s[j] - m);
      sum += s[j];
    }
    const float inv = static_cast<float>(1.0 / sum);
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

// head_dim a multiple of 16, at most 256.
BATON_AVX512 void GroupAvx512(const float* const* qh, float* const* oh,
                              int group, int64_t n_keys, const PagedKvView& kv,
                              int64_t g, float scale, float* scores) {
  const int64_t d = kv.head_dim;
  const int64_t nv = d / 16;
  const int64_t bs = kv.block_size;
  const int64_t head_stride = bs * d;
  __m512 q[kMaxGroup][16];
  for (int h = 0; h < group; ++h) {
    for (int64_t c = 0; c < nv; ++c) {
      q[h][c] = _mm512_loadu_ps(qh[h] + 16 * c);
    }
  }
  for (int64_t j = 0; j < n_keys; ++j) {
    const uint16_t* k = kv.k_blocks[j / bs] + g * head_stride + (j % bs) * d;
    __m512 kf[16];
    for (int64_t c = 0; c < nv; ++c) {
      kf[c] = _mm512_cvtph_ps(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + 16 * c)));
    }
    for (int h = 0; h < group; ++h) {
      __m512 acc = _mm512_mul_ps(q[h][0], kf[0]);
      for (int64_t c = 1; c < nv; ++c)
        acc = _mm512_fmadd_ps(q[h][c], kf[c], acc);
      scores[h * n_keys + j] = Reduce16(acc) * scale;
    }
  }
  for (int h = 0; h < group; ++h) {
    float* s = scores + h * n_keys;
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 16 <= n_keys; j += 16)
      vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(s + j));
    float m = _mm512_reduce_max_ps(vmax);
    for (; j < n_keys; ++j) m = std::max(m, s[j]);
    __m512 vm = _mm512_set1_ps(m);
    j = 0;
    for (; j + 16 <= n_keys; j += 16) {
      _mm512_storeu_ps(s + j, Exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), vm)));
    }
    if (j < n_keys) {
      __mmask16 mask = static_cast<__mmask16>((1u << (n_keys - j)) - 1);
      __m512 e = Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, s + j), vm));
      _mm512_mask_storeu_ps(s + j, mask, e);
    }
    double sum = 0.0;
    for (j = 0; j < n_keys; ++j) sum += s[j];
    const __m512 inv = _mm512_set1_ps(static_cast<float>(1.0 / sum));
    j = 0;
    for (; j + 16 <= n_keys; j += 16) {
      __m512 p = _mm512_mul_ps(_mm512_loadu_ps(s + j), inv);
      _mm512_storeu_ps(s + j, p);
    }
    if (j < n_keys) {
      __mmask16 mask = static_cast<__mmask16>((1u << (n_keys - j)) - 1);
      __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, s + j), inv);
      _mm512_mask_storeu_ps(s + j, mask, p);
    }
  }
  __m512 acc[kMaxGroup][16];
  for (int h = 0; h < group; ++h) {
    for (int64_t c = 0; c < nv; ++c) acc[h][c] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < n_keys; ++j) {
    const uint16_t* v = kv.v_blocks[j / bs] + g * head_stride + (j % bs) * d;
    __m512 vf[16];
    for (int64_t c = 0; c < nv; ++c) {
      vf[c] = _mm512_cvtph_ps(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 16 * c)));
    }
    for (int h = 0; h < group; ++h) {
      __m512 p = _mm512_set1_ps(scores[h * n_keys + j]);
      for (int64_t c = 0; c < nv; ++c)
        acc[h][c] = _mm512_fmadd_ps(p, vf[c], acc[h][c]);
    }
  }
  for (int h = 0; h < group; ++h) {
    for (int64_t c = 0; c < nv; ++c)
      _mm512_storeu_ps(oh[h] + 16 * c, acc[h][c]);
  }
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

// GroupAvx512 on 8-lane registers, two per 16 dims; head_dim a multiple of
// 16, at most 256. Same operations in the same order: the same bits.
BATON_AVX2 void GroupAvx2(const float* const* qh, float* const* oh, int group,
                          int64_t n_keys, const PagedKvView& kv, int64_t g,
                          float scale, float* scores) {
  const int64_t d = kv.head_dim;
  const int64_t nv = d / 8;  // 8-lane registers per row
  const int64_t bs = kv.block_size;
  const int64_t head_stride = bs * d;
  for (int64_t j = 0; j < n_keys; ++j) {
    const uint16_t* k = kv.k_blocks[j / bs] + g * head_stride + (j % bs) * d;
    __m256 kf[32];
    for (int64_t c = 0; c < nv; ++c) kf[c] = LoadHalves8(k + 8 * c);
    for (int h = 0; h < group; ++h) {
      const float* q = qh[h];
      __m256 lo = _mm256_mul_ps(_mm256_loadu_ps(q), kf[0]);
      __m256 hi = _mm256_mul_ps(_mm256_loadu_ps(q + 8), kf[1]);
      for (int64_t c = 2; c < nv; c += 2) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * c), kf[c], lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * c + 8), kf[c + 1], hi);
      }
      scores[h * n_keys + j] = Reduce16(lo, hi) * scale;
    }
  }
  for (int h = 0; h < group; ++h) {
    float* s = scores + h * n_keys;
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 8 <= n_keys; j += 8)
      vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + j));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vmax);
    float m = *std::max_element(lanes, lanes + 8);
    for (; j < n_keys; ++j) m = std::max(m, s[j]);
    const __m256 vm = _mm256_set1_ps(m);
    j = 0;
    for (; j + 8 <= n_keys; j += 8) {
      _mm256_storeu_ps(s + j, Exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm)));
    }
    for (; j < n_keys; ++j) s[j] = ExpNonPositive(s[j] - m);
    double sum = 0.0;
    for (j = 0; j < n_keys; ++j) sum += s[j];
    const float inv_f = static_cast<float>(1.0 / sum);
    const __m256 inv = _mm256_set1_ps(inv_f);
    j = 0;
    for (; j + 8 <= n_keys; j += 8) {
      _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_loadu_ps(s + j), inv));
    }
    for (; j < n_keys; ++j) s[j] = s[j] * inv_f;
  }
  for (int h = 0; h < group; ++h) {
    for (int64_t i = 0; i < d; ++i) oh[h][i] = 0.0f;
  }
  for (int64_t j = 0; j < n_keys; ++j) {
    const uint16_t* v = kv.v_blocks[j / bs] + g * head_stride + (j % bs) * d;
    __m256 vf[32];
    for (int64_t c = 0; c < nv; ++c) vf[c] = LoadHalves8(v + 8 * c);
    for (int h = 0; h < group; ++h) {
      const __m256 p = _mm256_set1_ps(scores[h * n_keys + j]);
      float* o = oh[h];
      for (int64_t c = 0; c < nv; ++c) {
        _mm256_storeu_ps(o + 8 * c,
                         _mm256_fmadd_ps(p, vf[c], _mm256_loadu_ps(o + 8 * c)));
      }
    }
  }
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
  thread_local std::vector<float> scratch;  // [group][n_keys] scores
  scratch.resize(group * max_keys);
  float* scores = scratch.data();
  const bool lanes16 = d % 16 == 0 && d <= 256;
  const bool avx512 =
      (isa == CpuIsa::kAvx512 || isa == CpuIsa::kAvx512Vnni) && lanes16;
  const bool avx2 = isa == CpuIsa::kAvx2 && lanes16;
  for (int64_t i = 0; i < num_queries; ++i) {
    const int64_t n_keys = start_pos + i + 1;
    for (int64_t g = 0; g < kv.num_kv_heads; ++g) {
      const float* qh[kMaxGroup];
      float* oh[kMaxGroup];
      for (int h = 0; h < group; ++h) {
        int64_t head = g * group + h;
        qh[h] = q + (i * shape.num_heads + head) * d;
        oh[h] = out + (i * shape.num_heads + head) * d;
      }
#if defined(__x86_64__)
      if (avx512) {
        GroupAvx512(qh, oh, group, n_keys, kv, g, shape.scale, scores);
        continue;
      }
      if (avx2) {
        GroupAvx2(qh, oh, group, n_keys, kv, g, shape.scale, scores);
        continue;
      }
#endif
      GroupScalar(qh, oh, group, n_keys, kv, g, shape.scale, scores);
    }
  }
}

}  // namespace baton
