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
#include "kernels/cpu/float16.h"

namespace baton {
namespace {

constexpr int kMaxGroup = 16;  // query heads per KV head handled together

// exp(x) for x <= 0 by range reduction and a degree-6 polynomial; within 2
// ulp of the true value on [-87, 0], 0 below. Scalar and vector versions do
// the same operations, so they agree bit for bit.
inline float ExpNonPositive(float x) {
  if (x < -87.0f) return 0.0f;
  float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(n, -0.693145751953125f, x);
  r = std::fma(n, -1.428606765330187045e-06f, r);
  float p = 1.0f / 720.0f;
  p = std::fma(p, r, 1.0f / 120.0f);
  p = std::fma(p, r, 1.0f / 24.0f);
  p = std::fma(p, r, 1.0f / 6.0f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  int32_t e = static_cast<int32_t>(n) + 127;
  return p * std::bit_cast<float>(static_cast<uint32_t>(e) << 23);
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
      for (int64_t i = 0; i < d; ++i)
        acc = std::fma(qh[h][i], F16ToF32(k[i]), acc);
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

BATON_AVX512 inline __m512 Exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.0f);
  __mmask16 underflow = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  __m512 n = _mm512_roundscale_ps(
      _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693145751953125f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
  __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
  return _mm512_maskz_mul_ps(~underflow, p, scale);
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
      scores[h * n_keys + j] = _mm512_reduce_add_ps(acc) * scale;
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
  bool avx512 = isa == CpuIsa::kAvx512Vnni && d % 16 == 0 && d <= 256;
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
#endif
      GroupScalar(qh, oh, group, n_keys, kv, g, shape.scale, scores);
    }
  }
}

}  // namespace baton
