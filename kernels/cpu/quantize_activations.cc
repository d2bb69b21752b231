#include "kernels/cpu/quantize_activations.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "kernels/cpu/float16.h"
#include "kernels/cpu/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>

// GCC 12 flags the _mm512_undefined_* placeholders inside its own
// intrinsics as (maybe-)uninitialized once they are inlined here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace baton {
namespace {

// Round half to even for |v| <= 2^22, exact under the default FP environment:
// adding 1.5 * 2^23 leaves no fraction bits, so the FPU rounds (to nearest
// even) exactly like cvtps2dq does.
inline float RoundHalfEven(float v) {
  constexpr float kMagic = 12582912.0f;
  const float t = v + kMagic;
  return t - kMagic;
}

// Scales and sums are kept at IEEE half precision, as GGUF's 8-bit block
// formats (Q8_0 / Q8_1) store them: measured on the default model this both
// tracks llama.cpp more closely (top-1 agreement 95.7% -> 97.2%) and lowers
// the mean logit error against an exact float64 forward pass (0.22 -> 0.18).
// The quants themselves are computed with the unrounded scale.
inline float StoredScale(float v) { return F16ToF32(F32ToF16(v)); }

inline void ScaleOf(float amax, float* d, float* id) {
  *d = amax / 127.0f;
  *id = *d != 0.0f ? 1.0f / *d : 0.0f;
}

void QuantizeRowScalar(const float* x, int64_t k, int8_t* q, float* d,
                       float* s) {
  for (int64_t b = 0; b < k / kQ8BlockSize; ++b) {
    const float* xb = x + b * kQ8BlockSize;
    float amax = 0.0f;
    for (int i = 0; i < kQ8BlockSize; ++i)
      amax = std::fmax(amax, std::fabs(xb[i]));
    float db, id;
    ScaleOf(amax, &db, &id);
    int32_t sum = 0;
    for (int i = 0; i < kQ8BlockSize; ++i) {
      const int32_t v = static_cast<int32_t>(RoundHalfEven(xb[i] * id));
      q[b * kQ8BlockSize + i] = static_cast<int8_t>(v);
      sum += v;
    }
    d[b] = StoredScale(db);
    s[b] = StoredScale(db * static_cast<float>(sum));
  }
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma,f16c"))) void QuantizeRowAvx2(
    const float* x, int64_t k, int8_t* q, float* d, float* s) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < k / kQ8BlockSize; ++b) {
    const float* xb = x + b * kQ8BlockSize;
    __m256 v[4];
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(xb + 8 * j);
      m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[j]));
    }
    __m128 m4 =
        _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float db, id;
    ScaleOf(_mm_cvtss_f32(m4), &db, &id);
    const __m256 idv = _mm256_set1_ps(id);
    __m256i i[4];
    for (int j = 0; j < 4; ++j)
      i[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], idv));
    __m256i sum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]),
                                   _mm256_add_epi32(i[2], i[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum),
                               _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    // packs interleave 128-bit lanes; the final permute restores order.
    const __m256i p16a = _mm256_packs_epi32(i[0], i[1]);
    const __m256i p16b = _mm256_packs_epi32(i[2], i[3]);
    const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    const __m256i fixed = _mm256_permutevar8x32_epi32(
        p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * kQ8BlockSize),
                        fixed);
    d[b] = StoredScale(db);
    s[b] = StoredScale(db * static_cast<float>(_mm_cvtsi128_si32(s4)));
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) void
QuantizeRowAvx512(const float* x, int64_t k, int8_t* q, float* d, float* s) {
  for (int64_t b = 0; b < k / kQ8BlockSize; ++b) {
    const float* xb = x + b * kQ8BlockSize;
    const __m512 v0 = _mm512_loadu_ps(xb);
    const __m512 v1 = _mm512_loadu_ps(xb + 16);
    const __m512 m = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1));
    float db, id;
    ScaleOf(_mm512_reduce_max_ps(m), &db, &id);
    const __m512 idv = _mm512_set1_ps(id);
    const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, idv));
    const __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, idv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kQ8BlockSize),
                     _mm512_cvtepi32_epi8(i0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kQ8BlockSize + 16),
                     _mm512_cvtepi32_epi8(i1));
    d[b] = StoredScale(db);
    s[b] = StoredScale(db * static_cast<float>(_mm512_reduce_add_epi32(
                                _mm512_add_epi32(i0, i1))));
  }
}
#endif

template <typename T>
T* AlignedAlloc(int64_t count) {
  const size_t bytes =
      (static_cast<size_t>(count) * sizeof(T) + 63) & ~size_t{63};
  void* p = std::aligned_alloc(64, bytes == 0 ? 64 : bytes);
  BATON_CHECK(p != nullptr) << "out of memory allocating " << bytes << " bytes";
  return static_cast<T*>(p);
}

}  // namespace

void Q8Activations::Resize(int64_t tokens, int64_t k) {
  BATON_CHECK(tokens >= 0 && k >= 0 && k % kQ8BlockSize == 0)
      << "tokens " << tokens << " k " << k;
  tokens_ = tokens;
  k_ = k;
  const int64_t quants = tokens * k;
  const int64_t blocks = quants / kQ8BlockSize;
  if (quants > quant_capacity_) {
    quants_.reset(AlignedAlloc<int8_t>(quants));
    quant_capacity_ = quants;
  }
  if (blocks > block_capacity_) {
    scales_.reset(AlignedAlloc<float>(blocks));
    sums_.reset(AlignedAlloc<float>(blocks));
    block_capacity_ = blocks;
  }
}

void QuantizeRowQ8(const float* x, int64_t k, int8_t* q, float* d, float* s,
                   CpuIsa isa) {
  switch (isa) {
#if defined(__x86_64__)
    case CpuIsa::kAvx512:
    case CpuIsa::kAvx512Vnni:
      QuantizeRowAvx512(x, k, q, d, s);
      return;
    case CpuIsa::kAvx2:
      QuantizeRowAvx2(x, k, q, d, s);
      return;
#endif
    default:
      QuantizeRowScalar(x, k, q, d, s);
  }
}

absl::Status QuantizeActivations(const float* x, int64_t tokens, int64_t k,
                                 Q8Activations* out, ThreadPool* pool,
                                 CpuIsa isa) {
  if (k <= 0 || k % kQ8BlockSize != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("k must be a positive multiple of 32, got ", k));
  }
  if (tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens must be >= 0, got ", tokens));
  }
  if (!IsCpuIsaSupported(isa)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CPU ISA ", CpuIsaName(isa), " is not supported by this CPU"));
  }
  out->Resize(tokens, k);
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      QuantizeRowQ8(x + t * k, k, out->quants(t), out->scales(t), out->sums(t),
                    isa);
    }
  };
  // Small inputs are cheaper than a wake-up.
  if (pool != nullptr && tokens * k >= (int64_t{1} << 16)) {
    pool->ParallelFor(tokens, run);
  } else {
    run(0, tokens);
  }
  return absl::OkStatus();
}

}  // namespace baton
