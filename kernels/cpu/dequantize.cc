#include "kernels/cpu/dequantize.h"

#include <bit>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/float16.h"

namespace baton {
namespace {

static_assert(std::endian::native == std::endian::little,
              "GGUF blocks are read as little-endian in place");

constexpr int kQK = 32;     // elements per block of the legacy types
constexpr int kQK_K = 256;  // elements per super-block of the K types

float LoadF16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return F16ToF32(h);
}

// One block of each type: `b` points at block_bytes bytes, `y` receives
// block_size floats. Field layouts are ggml's.

// Q4_0 (18 bytes): f16 d, 16 bytes of nibbles; element l < 16 is the low
// nibble of byte l, element 16 + l its high nibble. y = d * (q - 8).
void BlockQ4_0(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const uint8_t* qs = b + 2;
  for (int l = 0; l < kQK / 2; ++l) {
    y[l] = d * static_cast<float>((qs[l] & 0xF) - 8);
    y[l + kQK / 2] = d * static_cast<float>((qs[l] >> 4) - 8);
  }
}

// Q4_1 (20 bytes): f16 d, f16 m, nibbles as Q4_0. y = (d * q) + m.
void BlockQ4_1(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const float m = LoadF16(b + 2);
  const uint8_t* qs = b + 4;
  for (int l = 0; l < kQK / 2; ++l) {
    y[l] = d * static_cast<float>(qs[l] & 0xF) + m;
    y[l + kQK / 2] = d * static_cast<float>(qs[l] >> 4) + m;
  }
}

// Q5_0 (22 bytes): f16 d, u32 qh (bit i is bit 4 of element i), nibbles as
// Q4_0. y = d * (q - 16).
void BlockQ5_0(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, sizeof(qh));
  const uint8_t* qs = b + 6;
  for (int l = 0; l < kQK / 2; ++l) {
    const int lo = (qs[l] & 0xF) | (((qh >> l) & 1) << 4);
    const int hi = (qs[l] >> 4) | (((qh >> (l + 16)) & 1) << 4);
    y[l] = d * static_cast<float>(lo - 16);
    y[l + kQK / 2] = d * static_cast<float>(hi - 16);
  }
}

// Q5_1 (24 bytes): f16 d, f16 m, u32 qh, nibbles. y = (d * q) + m.
void BlockQ5_1(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const float m = LoadF16(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, sizeof(qh));
  const uint8_t* qs = b + 8;
  for (int l = 0; l < kQK / 2; ++l) {
    const int lo = (qs[l] & 0xF) | (((qh >> l) & 1) << 4);
    const int hi = (qs[l] >> 4) | (((qh >> (l + 16)) & 1) << 4);
    y[l] = d * static_cast<float>(lo) + m;
    y[l + kQK / 2] = d * static_cast<float>(hi) + m;
  }
}

// Q8_0 (34 bytes): f16 d, 32 int8. y = q * d.
void BlockQ8_0(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int l = 0; l < kQK; ++l) y[l] = static_cast<float>(qs[l]) * d;
}

// Q2_K (84 bytes): 16 scale bytes (low nibble scale, high nibble min, one per
// 16 elements), 64 bytes of 2-bit quants, f16 d, f16 dmin. Element
// 128 j + 32 s + l is bits 2s..2s+1 of qs[32 j + l].
// y = (d * sc) * q - (dmin * mn).
void BlockQ2_K(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = LoadF16(b + 80);
  const float dmin = LoadF16(b + 82);
  for (int sub = 0; sub < kQK_K / 16; ++sub) {
    const float dl = d * static_cast<float>(scales[sub] & 0xF);
    const float ml = dmin * static_cast<float>(scales[sub] >> 4);
    const int j = sub / 8;
    const int shift = 2 * ((sub % 8) / 2);
    const uint8_t* q = qs + 32 * j + 16 * (sub % 2);
    float* out = y + 16 * sub;
    for (int l = 0; l < 16; ++l) {
      out[l] = dl * static_cast<float>((q[l] >> shift) & 3) - ml;
    }
  }
}

// Q3_K (110 bytes): 32 bytes hmask, 64 bytes of 2-bit quants (laid out as
// Q2_K), 12 bytes of sixteen 6-bit scales, f16 d. Element e = 32 i + l has
// high bit (hmask[l] >> i) & 1; q = low - (high ? 0 : 4).
// y = (d * (sc - 32)) * q.
void BlockQ3_K(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* scales = b + 96;
  const float d = LoadF16(b + 108);
  for (int sub = 0; sub < kQK_K / 16; ++sub) {
    const int sc = ((scales[sub % 8] >> (4 * (sub / 8))) & 0xF) |
                   (((scales[8 + sub % 4] >> (2 * (sub / 4))) & 3) << 4);
    const float dl = d * static_cast<float>(sc - 32);
    const int j = sub / 8;
    const int shift = 2 * ((sub % 8) / 2);
    const int hbit = sub / 2;
    const int l0 = 16 * (sub % 2);
    const uint8_t* q = qs + 32 * j;
    float* out = y + 16 * sub;
    for (int l = 0; l < 16; ++l) {
      const int low = (q[l0 + l] >> shift) & 3;
      const int high = (hmask[l0 + l] >> hbit) & 1;
      out[l] = dl * static_cast<float>(low - (high ? 0 : 4));
    }
  }
}

// The eight 6-bit scales and mins of Q4_K / Q5_K, packed in 12 bytes:
// bytes 0-3 hold sc[0..3] (bits 0-5) and sc[4..7] bits 4-5 (bits 6-7),
// bytes 4-7 the same for mins, bytes 8-11 sc[4..7] and mn[4..7] bits 0-3.
void UnpackScaleMin(const uint8_t* s, int sc[8], int mn[8]) {
  for (int i = 0; i < 4; ++i) {
    sc[i] = s[i] & 0x3F;
    mn[i] = s[4 + i] & 0x3F;
    sc[4 + i] = (s[8 + i] & 0xF) | ((s[i] >> 2) & 0x30);
    mn[4 + i] = (s[8 + i] >> 4) | ((s[4 + i] >> 2) & 0x30);
  }
}

// Q4_K (144 bytes): f16 d, f16 dmin, 12 scale bytes, 128 bytes of nibbles;
// element 64 j + 32 k + l is nibble k of qs[32 j + l], in sub-block 2 j + k.
// y = (d * sc) * q - (dmin * mn).
void BlockQ4_K(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const float dmin = LoadF16(b + 2);
  int sc[8], mn[8];
  UnpackScaleMin(b + 4, sc, mn);
  const uint8_t* qs = b + 16;
  for (int sub = 0; sub < 8; ++sub) {
    const float dl = d * static_cast<float>(sc[sub]);
    const float ml = dmin * static_cast<float>(mn[sub]);
    const uint8_t* q = qs + 32 * (sub / 2);
    const int shift = 4 * (sub % 2);
    float* out = y + 32 * sub;
    for (int l = 0; l < 32; ++l) {
      out[l] = dl * static_cast<float>((q[l] >> shift) & 0xF) - ml;
    }
  }
}

// Q5_K (176 bytes): as Q4_K with 32 bytes qh before the nibbles; element
// 32 i + l has bit 4 = (qh[l] >> i) & 1.
void BlockQ5_K(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const float dmin = LoadF16(b + 2);
  int sc[8], mn[8];
  UnpackScaleMin(b + 4, sc, mn);
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int sub = 0; sub < 8; ++sub) {
    const float dl = d * static_cast<float>(sc[sub]);
    const float ml = dmin * static_cast<float>(mn[sub]);
    const uint8_t* q = qs + 32 * (sub / 2);
    const int shift = 4 * (sub % 2);
    float* out = y + 32 * sub;
    for (int l = 0; l < 32; ++l) {
      const int v = ((q[l] >> shift) & 0xF) | (((qh[l] >> sub) & 1) << 4);
      out[l] = dl * static_cast<float>(v) - ml;
    }
  }
}

// Q6_K (210 bytes): 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16
// int8 scales, f16 d. Element 128 j + 64 k + l (l < 64) has low nibble k of
// ql[64 j + l]; element 128 j + 32 s + l (l < 32) has high bits
// (qh[32 j + l] >> 2s) & 3. y = (d * sc) * (q - 32).
void BlockQ6_K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = LoadF16(b + 208);
  for (int sub = 0; sub < kQK_K / 16; ++sub) {
    const float dl = d * static_cast<float>(scales[sub]);
    const int e0 = 16 * sub;  // first element of the sub-block
    const int j = e0 / 128;   // half of the super-block
    const int r = e0 % 128;   // offset inside the half
    const uint8_t* lo = ql + 64 * j + r % 64;
    const int lo_shift = 4 * (r / 64);
    const uint8_t* hi = qh + 32 * j + r % 32;
    const int hi_shift = 2 * (r / 32);
    float* out = y + e0;
    for (int l = 0; l < 16; ++l) {
      const int q =
          (((lo[l] >> lo_shift) & 0xF) | (((hi[l] >> hi_shift) & 3) << 4)) - 32;
      out[l] = dl * static_cast<float>(q);
    }
  }
}

using BlockFn = void (*)(const uint8_t* block, float* out);

template <BlockFn kFn, int kBlockSize, int kBlockBytes>
void DequantizeBlocks(const uint8_t* src, float* dst, int64_t num_blocks) {
  for (int64_t i = 0; i < num_blocks; ++i) {
    kFn(src + i * kBlockBytes, dst + i * kBlockSize);
  }
}

void DequantizeF32(const uint8_t* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void DequantizeF16(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = LoadF16(src + 2 * i);
}

void DequantizeBF16(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, sizeof(h));
    dst[i] = BF16ToF32(h);
  }
}

// `num_blocks` blocks from src to dst (block_size floats per block).
using RowFn = void (*)(const uint8_t* src, float* dst, int64_t num_blocks);

// nullptr for a type without a kernel.
RowFn FindRowFn(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return DequantizeF32;
    case DType::kF16:
      return DequantizeF16;
    case DType::kBF16:
      return DequantizeBF16;
    case DType::kQ4_0:
      return DequantizeBlocks<BlockQ4_0, kQK, 18>;
    case DType::kQ4_1:
      return DequantizeBlocks<BlockQ4_1, kQK, 20>;
    case DType::kQ5_0:
      return DequantizeBlocks<BlockQ5_0, kQK, 22>;
    case DType::kQ5_1:
      return DequantizeBlocks<BlockQ5_1, kQK, 24>;
    case DType::kQ8_0:
      return DequantizeBlocks<BlockQ8_0, kQK, 34>;
    case DType::kQ2_K:
      return DequantizeBlocks<BlockQ2_K, kQK_K, 84>;
    case DType::kQ3_K:
      return DequantizeBlocks<BlockQ3_K, kQK_K, 110>;
    case DType::kQ4_K:
      return DequantizeBlocks<BlockQ4_K, kQK_K, 144>;
    case DType::kQ5_K:
      return DequantizeBlocks<BlockQ5_K, kQK_K, 176>;
    case DType::kQ6_K:
      return DequantizeBlocks<BlockQ6_K, kQK_K, 210>;
    default:
      return nullptr;
  }
}

std::string DTypeLabel(DType dtype) {
  const DTypeInfo* info = FindDTypeInfo(static_cast<uint32_t>(dtype));
  if (info != nullptr) return std::string(info->name);
  return absl::StrCat("ggml type ", static_cast<uint32_t>(dtype));
}

absl::Status Unsupported(DType dtype) {
  return absl::UnimplementedError(
      absl::StrCat("dequantization of ", DTypeLabel(dtype),
                   " is not supported (supported: F32, F16, BF16, Q4_0, "
                   "Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)"));
}

}  // namespace

bool CanDequantize(DType dtype) { return FindRowFn(dtype) != nullptr; }

absl::Status DequantizeRow(DType dtype, const void* src, float* dst,
                           int64_t n) {
  const RowFn fn = FindRowFn(dtype);
  if (fn == nullptr) return Unsupported(dtype);
  const DTypeInfo& info = GetDTypeInfo(dtype);
  if (n < 0 || n % info.block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("element count ", n, " is not a non-negative multiple of ",
                     info.name, "'s block size ", info.block_size));
  }
  if (n == 0) return absl::OkStatus();
  fn(static_cast<const uint8_t*>(src), dst, n / info.block_size);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> DequantizeTensor(const TensorView& tensor) {
  if (!CanDequantize(tensor.dtype)) {
    return absl::UnimplementedError(absl::StrCat(
        "tensor '", tensor.name, "': ", Unsupported(tensor.dtype).message()));
  }
  BATON_ASSIGN_OR_RETURN(const uint64_t nbytes,
                         TensorBytes(tensor.dtype, tensor.shape));
  if (nbytes != tensor.nbytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", tensor.name, "' of type ", DTypeName(tensor.dtype),
        " and shape ", ShapeToString(tensor.shape), " needs ", nbytes,
        " bytes, but its view has ", tensor.nbytes));
  }
  if (tensor.data == nullptr && nbytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor.name, "' has no data"));
  }
  const int64_t n = tensor.NumElements();
  std::vector<float> out(static_cast<size_t>(n));
  BATON_RETURN_IF_ERROR(
      DequantizeRow(tensor.dtype, tensor.data, out.data(), n));
  return out;
}

}  // namespace baton
