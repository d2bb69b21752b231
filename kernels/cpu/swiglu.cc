#include "kernels/cpu/swiglu.h"

// GCC 12 reports its own AVX-512 intrinsics' deliberately undefined
// pass-through operands as maybe-uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace baton {
namespace {

// e^x by range reduction (x = n ln2 + r, |r| <= ln2 / 2) and a degree-7
// polynomial, within about 1 ulp on [-87, 88]; 0 below, infinity above (so
// silu(g) = g / (1 + e^-g) is -0 for g < -88, where it is below 1e-35).
// Every path does these operations in this order: the same bits.
inline float ExpClamped(float x) {
  if (x > 88.0f) return std::numeric_limits<float>::infinity();
  if (x < -87.0f) return 0.0f;
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(n, -0.693145751953125f, x);
  r = std::fma(n, -1.428606765330187045e-06f, r);
  float p = 1.0f / 5040.0f;
  p = std::fma(p, r, 1.0f / 720.0f);
  p = std::fma(p, r, 1.0f / 120.0f);
  p = std::fma(p, r, 1.0f / 24.0f);
  p = std::fma(p, r, 1.0f / 6.0f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  const int32_t e = static_cast<int32_t>(n) + 127;
  return p * std::bit_cast<float>(static_cast<uint32_t>(e) << 23);
}

inline float Silu(float g) { return g / (1.0f + ExpClamped(-g)); }

void SwiGluScalar(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = Silu(gate[i]) * up[i];
}

#if defined(__x86_64__)
#define BATON_AVX2 __attribute__((target("avx2,fma,f16c")))
#define BATON_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

BATON_AVX2 inline __m256 Exp8(__m256 x) {
  const __m256 over = _mm256_cmp_ps(x, _mm256_set1_ps(88.0f), _CMP_GT_OQ);
  x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
  const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_NLT_UQ);
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693145751953125f), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-1.428606765330187045e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e =
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
  return _mm256_blendv_ps(
      _mm256_and_ps(_mm256_mul_ps(p, scale), keep),
      _mm256_set1_ps(std::numeric_limits<float>::infinity()), over);
}

BATON_AVX2 void SwiGluAvx2(const float* gate, const float* up, int64_t n,
                           float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 zero = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 t = Exp8(_mm256_sub_ps(zero, g));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, t));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  SwiGluScalar(gate + i, up + i, n - i, out + i);
}

BATON_AVX512 inline __m512 Exp16(__m512 x) {
  const __mmask16 over =
      _mm512_cmp_ps_mask(x, _mm512_set1_ps(88.0f), _CMP_GT_OQ);
  x = _mm512_min_ps(x, _mm512_set1_ps(88.0f));
  const __mmask16 keep =
      _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_NLT_UQ);
  const __m512 n = _mm512_roundscale_ps(
      _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693145751953125f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512i e =
      _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
  const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
  return _mm512_mask_mov_ps(
      _mm512_maskz_mul_ps(keep, p, scale), over,
      _mm512_set1_ps(std::numeric_limits<float>::infinity()));
}

BATON_AVX512 void SwiGluAvx512(const float* gate, const float* up, int64_t n,
                               float* out) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 zero = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 t = Exp16(_mm512_sub_ps(zero, g));
    const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, t));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(silu, _mm512_loadu_ps(up + i)));
  }
  SwiGluScalar(gate + i, up + i, n - i, out + i);
}
#endif

}  // namespace

void SwiGlu(const float* gate, const float* up, int64_t n, float* out,
            CpuIsa isa) {
#if defined(__x86_64__)
  switch (isa) {
    case CpuIsa::kAvx512:
    case CpuIsa::kAvx512Vnni:
      SwiGluAvx512(gate, up, n, out);
      return;
    case CpuIsa::kAvx2:
      SwiGluAvx2(gate, up, n, out);
      return;
    case CpuIsa::kScalar:
      break;
  }
#endif
  (void)isa;
  SwiGluScalar(gate, up, n, out);
}

}  // namespace baton
