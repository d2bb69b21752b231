// Scalar IEEE half and bfloat16 conversions, bit-exact with numpy's
// float16 -> float32 and float32 -> float16 (round to nearest even).
#ifndef BATON_KERNELS_CPU_FLOAT16_H_
#define BATON_KERNELS_CPU_FLOAT16_H_

#include <bit>
#include <cstdint>

namespace baton {

// Exact: every half (subnormals, infinities, NaN payloads) maps to the float
// with the same value.
inline float F16ToF32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {
    // Subnormal half: normalise into a float.
    // Subnormal half: man * 2^-24 = 2^(p-24) * 1.f with p the top set bit.
    uint32_t p = 31u - static_cast<uint32_t>(std::countl_zero(man));
    bits = sign | ((p + 103u) << 23) | ((man << (23u - p)) & 0x7fffffu);
  }
  return std::bit_cast<float>(bits);
}

// Round to nearest even; overflow goes to infinity, NaN stays NaN.
inline uint16_t F32ToF16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return sign |
           (abs > 0x7f800000u ? 0x7e00u | ((abs >> 13) & 0x3ffu) : 0x7c00u);
  }
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds past 65504
  if (abs < 0x38800000u) {                        // result is subnormal or zero
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal
    uint32_t e = abs >> 23;
    uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // value = m * 2^(e-150); half units are 2^-24
    uint32_t half = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  uint32_t half = ((abs >> 13) - (112u << 10));
  uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return sign | static_cast<uint16_t>(half);
}

inline float BF16ToF32(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

// Round to nearest even; NaN stays a quiet NaN.
inline uint16_t F32ToBF16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace baton

#endif  // BATON_KERNELS_CPU_FLOAT16_H_
