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

#include "kernels/cpu/exp_approx.h"

namespace baton {
namespace {

// e^x within about 1 ulp, the same bits on every path (exp_approx.h); 0
// below -87 and infinity above 88, so silu(g) = g / (1 + e^-g) is -0 for
// g < -88, where it is below 1e-35.
inline float ExpClamped(float x) { return exp_approx::Exp<7>(x); }

inline float Silu(float g) { return g / (1.0f + ExpClamped(-g)); }

void SwiGluScalar(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = Silu(gate[i]) * up[i];
}

#if defined(__x86_64__)
#define BATON_AVX2 __attribute__((target("avx2,fma,f16c")))
#define BATON_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

BATON_AVX2 inline __m256 Exp8(__m256 x) { return exp_approx::Exp8<7>(x); }

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

BATON_AVX512 inline __m512 Exp16(__m512 x) { return exp_approx::Exp16<7>(x); }

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
