// Internal to the MatMul kernels: the f16 scales (and Q4_1 minimums) of
// eight consecutive ggml blocks, read in one go for the AVX2 and AVX-512
// paths. Going block by block, a decode step's matrix-vector products spent
// a sixth of their time reading them.
#ifndef BATON_KERNELS_CPU_MATMUL_HALFS_H_
#define BATON_KERNELS_CPU_MATMUL_HALFS_H_

#if defined(__x86_64__)

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace baton::matmul_internal {

// The f16 at byte `kOffset` of each of the 8 blocks of kBlockBytes from
// `first` on, widened to f32 (exact: every f16 is an f32).
template <int kBlockBytes, int kOffset>
__attribute__((target("avx2,f16c"))) inline __m256 BlockHalfs8(
    const uint8_t* first) {
  const uint8_t* p = first + kOffset;
  auto at = [p](int i) {
    uint16_t h;
    std::memcpy(&h, p + i * kBlockBytes, 2);
    return static_cast<int>(h);
  };
  // Inserted one by one: eight 2-byte stores read back as one 16-byte load
  // would stall on store forwarding.
  __m128i v = _mm_cvtsi32_si128(at(0));
  v = _mm_insert_epi16(v, at(1), 1);
  v = _mm_insert_epi16(v, at(2), 2);
  v = _mm_insert_epi16(v, at(3), 3);
  v = _mm_insert_epi16(v, at(4), 4);
  v = _mm_insert_epi16(v, at(5), 5);
  v = _mm_insert_epi16(v, at(6), 6);
  v = _mm_insert_epi16(v, at(7), 7);
  return _mm256_cvtph_ps(v);
}

}  // namespace baton::matmul_internal

#endif  // defined(__x86_64__)

#endif  // BATON_KERNELS_CPU_MATMUL_HALFS_H_
