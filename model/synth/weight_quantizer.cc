#include "model/synth/weight_quantizer.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"
#include "kernels/cpu/float16.h"

// Built with -ffp-contract=off: numpy rounds every product before the add.

namespace baton {
namespace {

constexpr int kBlock = 32;

void PutF16(uint8_t* out, float v) {
  uint16_t h = F32ToF16(v);
  std::memcpy(out, &h, 2);
}

// numpy's trunc() then float -> uint8 cast, for the in-range values these
// formulas make; anything else (only reachable from non-finite input)
// becomes 0.
int ToSmallInt(float t) {
  return (t >= 0.0f && t < 256.0f) ? static_cast<int>(t) : 0;
}

// Q4_0: d = x[argmax |x|] / -8, q = min(trunc(x / d + 8.5), 15).
void QuantizeQ4_0Block(const float* x, uint8_t* out) {
  int imax = 0;
  float amax = std::fabs(x[0]);
  for (int j = 1; j < kBlock; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      imax = j;
    }
  }
  float d = x[imax] / -8.0f;
  float id = d == 0.0f ? 0.0f : 1.0f / d;
  uint8_t q[kBlock];
  for (int j = 0; j < kBlock; ++j) {
    int v = ToSmallInt(x[j] * id + 8.5f);
    q[j] = static_cast<uint8_t>(v > 15 ? 15 : v);
  }
  PutF16(out, d);
  for (int j = 0; j < kBlock / 2; ++j) {
    out[2 + j] = static_cast<uint8_t>(q[j] | (q[j + kBlock / 2] << 4));
  }
}

// Q4_1: d = (max - min) / 15, m = min, q = min(trunc((x - min) / d + 0.5), 15).
// A block whose min (or max) is both +0 and -0 may differ from numpy in the
// sign of m: numpy's SIMD reduction picks one by lane position.
void QuantizeQ4_1Block(const float* x, uint8_t* out) {
  float mn = x[0];
  float mx = x[0];
  for (int j = 1; j < kBlock; ++j) {
    mn = x[j] < mn ? x[j] : mn;
    mx = x[j] > mx ? x[j] : mx;
  }
  float d = (mx - mn) / 15.0f;
  float id = d == 0.0f ? 0.0f : 1.0f / d;
  uint8_t q[kBlock];
  for (int j = 0; j < kBlock; ++j) {
    int v = ToSmallInt((x[j] - mn) * id + 0.5f);
    q[j] = static_cast<uint8_t>(v > 15 ? 15 : v);
  }
  PutF16(out, d);
  PutF16(out + 2, mn);
  for (int j = 0; j < kBlock / 2; ++j) {
    out[4 + j] = static_cast<uint8_t>(q[j] | (q[j + kBlock / 2] << 4));
  }
}

// Q8_0: d = max |x| / 127, q = round-half-away(x / d) as numpy's np_roundf
// computes it: floor(a) + floor(2 * (a - floor(a))) with a = |x / d|.
void QuantizeQ8_0Block(const float* x, uint8_t* out) {
  float amax = 0.0f;
  for (int j = 0; j < kBlock; ++j) {
    float a = std::fabs(x[j]);
    amax = a > amax ? a : amax;
  }
  float d = amax / 127.0f;
  float id = d == 0.0f ? 0.0f : 1.0f / d;
  PutF16(out, d);
  for (int j = 0; j < kBlock; ++j) {
    float v = x[j] * id;
    float a = std::fabs(v);
    // floor() of values in [0, 2^31) as integer truncation.
    float fl =
        a < 2147483648.0f ? static_cast<float>(static_cast<int32_t>(a)) : a;
    float twice = 2.0f * (a - fl);
    float b = fl + (twice >= 1.0f ? 1.0f : 0.0f);
    int r = (b >= 0.0f && b <= 128.0f) ? static_cast<int>(b) : 0;
    if (r > 127) r = 127;
    int8_t q = static_cast<int8_t>(v < 0.0f ? -r : r);
    std::memcpy(out + 2 + j, &q, 1);
  }
}

}  // namespace

bool CanQuantizeWeights(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ8_0:
      return true;
    default:
      return false;
  }
}

absl::Status QuantizeWeights(DType dtype, std::span<const float> src,
                             std::span<uint8_t> dst) {
  if (!CanQuantizeWeights(dtype)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot quantize weights to %s (supported: F32, F16, BF16, Q4_0, "
        "Q4_1, Q8_0)",
        DTypeName(dtype)));
  }
  const DTypeInfo& info = GetDTypeInfo(dtype);
  if (src.size() % info.block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d values are not a whole number of %s blocks of %d",
                        src.size(), info.name, info.block_size));
  }
  size_t blocks = src.size() / info.block_size;
  if (dst.size() != blocks * info.block_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d values of %s take %d bytes, output has %d", src.size(), info.name,
        blocks * info.block_bytes, dst.size()));
  }
  const float* x = src.data();
  uint8_t* out = dst.data();
  switch (dtype) {
    case DType::kF32:
      if (!src.empty()) std::memcpy(out, x, src.size() * sizeof(float));
      break;
    case DType::kF16:
      for (size_t i = 0; i < src.size(); ++i) PutF16(out + 2 * i, x[i]);
      break;
    case DType::kBF16:
      for (size_t i = 0; i < src.size(); ++i) {
        uint16_t b = F32ToBF16(x[i]);
        std::memcpy(out + 2 * i, &b, 2);
      }
      break;
    case DType::kQ4_0:
      for (size_t b = 0; b < blocks; ++b) {
        QuantizeQ4_0Block(x + b * kBlock, out + b * info.block_bytes);
      }
      break;
    case DType::kQ4_1:
      for (size_t b = 0; b < blocks; ++b) {
        QuantizeQ4_1Block(x + b * kBlock, out + b * info.block_bytes);
      }
      break;
    case DType::kQ8_0:
      for (size_t b = 0; b < blocks; ++b) {
        QuantizeQ8_0Block(x + b * kBlock, out + b * info.block_bytes);
      }
      break;
    default:
      break;
  }
  return absl::OkStatus();
}

}  // namespace baton
