// e^x for the CPU kernels that need it (attention's softmax, SwiGLU), one
// definition for the scalar, AVX2 and AVX-512 paths so that every path gives
// the same bits: range reduction x = n ln2 + r (|r| <= ln2 / 2, ln2 in two
// parts), a degree-kDegree Taylor polynomial in Horner form with fused
// multiply-adds, and 2^n built in the exponent field. 0 below -87, infinity
// above 88, NaN for NaN. Degree 6 is within about 2 ulp, degree 7 about 1.
#ifndef BATON_KERNELS_CPU_EXP_APPROX_H_
#define BATON_KERNELS_CPU_EXP_APPROX_H_

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace baton::exp_approx {

inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = -0.693145751953125f;
inline constexpr float kLn2Lo = -1.428606765330187045e-06f;
inline constexpr float kLow = -87.0f;
inline constexpr float kHigh = 88.0f;
// 1/k!, k = 0..7.
inline constexpr float kCoeff[] = {1.0f,          1.0f,          0.5f,
                                   1.0f / 6.0f,   1.0f / 24.0f,  1.0f / 120.0f,
                                   1.0f / 720.0f, 1.0f / 5040.0f};

template <int kDegree>
inline float Exp(float x) {
  static_assert(kDegree >= 1 && kDegree <= 7);
  if (x > kHigh) return std::numeric_limits<float>::infinity();
  if (x < kLow) return 0.0f;
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(n, kLn2Hi, x);
  r = std::fma(n, kLn2Lo, r);
  float p = kCoeff[kDegree];
  for (int k = kDegree - 1; k >= 0; --k) p = std::fma(p, r, kCoeff[k]);
  const int32_t e = static_cast<int32_t>(n) + 127;
  return p * std::bit_cast<float>(static_cast<uint32_t>(e) << 23);
}

#if defined(__x86_64__)
#define BATON_EXP_AVX2 __attribute__((target("avx2,fma,f16c")))
#define BATON_EXP_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

template <int kDegree>
BATON_EXP_AVX2 inline __m256 Exp8(__m256 x) {
  const __m256 over = _mm256_cmp_ps(x, _mm256_set1_ps(kHigh), _CMP_GT_OQ);
  const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(kLow), _CMP_NLT_UQ);
  x = _mm256_min_ps(_mm256_set1_ps(kHigh), x);  // NaN stays NaN
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kCoeff[kDegree]);
  for (int k = kDegree - 1; k >= 0; --k) {
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kCoeff[k]));
  }
  const __m256i e =
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
  return _mm256_blendv_ps(
      _mm256_and_ps(_mm256_mul_ps(p, scale), keep),
      _mm256_set1_ps(std::numeric_limits<float>::infinity()), over);
}

template <int kDegree>
BATON_EXP_AVX512 inline __m512 Exp16(__m512 x) {
  const __mmask16 over =
      _mm512_cmp_ps_mask(x, _mm512_set1_ps(kHigh), _CMP_GT_OQ);
  const __mmask16 keep =
      _mm512_cmp_ps_mask(x, _mm512_set1_ps(kLow), _CMP_NLT_UQ);
  x = _mm512_min_ps(_mm512_set1_ps(kHigh), x);  // NaN stays NaN
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kCoeff[kDegree]);
  for (int k = kDegree - 1; k >= 0; --k) {
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kCoeff[k]));
  }
  const __m512i e =
      _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
  const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
  return _mm512_mask_mov_ps(
      _mm512_maskz_mul_ps(keep, p, scale), over,
      _mm512_set1_ps(std::numeric_limits<float>::infinity()));
}

#undef BATON_EXP_AVX2
#undef BATON_EXP_AVX512
#endif

}  // namespace baton::exp_approx

#endif  // BATON_KERNELS_CPU_EXP_APPROX_H_
