#include "kernels/cpu/dequantize.h"

#include <bit>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/float16.h"
#include "kernels/cpu/quant_blocks.h"

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
// The 32 five-bit codes (0..31) of a Q5_0 / Q5_1 block in element order:
// u32 qh at `qh` (bit i is bit 4 of element i), nibbles at `qs` as Q4_0.
void UnpackQ5(const uint8_t* qh_bytes, const uint8_t* qs, int8_t* q) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, sizeof(qh));
  for (int l = 0; l < kQK / 2; ++l) {
    q[l] = static_cast<int8_t>((qs[l] & 0xF) | (((qh >> l) & 1) << 4));
    q[l + kQK / 2] =
        static_cast<int8_t>((qs[l] >> 4) | (((qh >> (l + 16)) & 1) << 4));
  }
}

// The 32 codes q - 16 of a Q5_0 block, in element order.
void UnpackQ5_0(const uint8_t* b, int8_t* q) {
  UnpackQ5(b + 2, b + 6, q);
  for (int l = 0; l < kQK; ++l) q[l] = static_cast<int8_t>(q[l] - 16);
}

void BlockQ5_0(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  int8_t q[kQK];
  UnpackQ5_0(b, q);
  for (int l = 0; l < kQK; ++l) y[l] = d * static_cast<float>(q[l]);
}

// Q5_1 (24 bytes): f16 d, f16 m, u32 qh, nibbles. y = (d * q) + m.
void BlockQ5_1(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const float m = LoadF16(b + 2);
  int8_t q[kQK];
  UnpackQ5(b + 4, b + 8, q);
  for (int l = 0; l < kQK; ++l) y[l] = d * static_cast<float>(q[l]) + m;
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
// The 256 codes (-4..3) and sixteen scales sc - 32 of a Q3_K block.
void UnpackQ3_K(const uint8_t* b, int8_t* q, int* sc) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* scales = b + 96;
  for (int sub = 0; sub < kQK_K / 16; ++sub) {
    sc[sub] = (((scales[sub % 8] >> (4 * (sub / 8))) & 0xF) |
               (((scales[8 + sub % 4] >> (2 * (sub / 4))) & 3) << 4)) -
              32;
    const int j = sub / 8;
    const int shift = 2 * ((sub % 8) / 2);
    const int hbit = sub / 2;
    const int l0 = 16 * (sub % 2);
    const uint8_t* qj = qs + 32 * j;
    for (int l = 0; l < 16; ++l) {
      const int low = (qj[l0 + l] >> shift) & 3;
      const int high = (hmask[l0 + l] >> hbit) & 1;
      q[16 * sub + l] = static_cast<int8_t>(low - (high ? 0 : 4));
    }
  }
}

void BlockQ3_K(const uint8_t* b, float* y) {
  const float d = LoadF16(b + 108);
  int8_t q[kQK_K];
  int sc[kQK_K / 16];
  UnpackQ3_K(b, q, sc);
  for (int e = 0; e < kQK_K; ++e) {
    const float dl = d * static_cast<float>(sc[e / 16]);
    y[e] = dl * static_cast<float>(q[e]);
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

// Q4_K_R (24 bytes, Baton's repacked Q4_K): f32 d, f32 m, 16 bytes of
// nibbles in Q4_1's order; y = (d * q) + m, the same bits as BlockQ4_K.
void BlockQ4_KR(const uint8_t* b, float* y) {
  float d, m;
  std::memcpy(&d, b, sizeof(d));
  std::memcpy(&m, b + 4, sizeof(m));
  const uint8_t* qs = b + 8;
  for (int i = 0; i < 16; ++i) {
    y[i] = d * static_cast<float>(qs[i] & 0xF) + m;
    y[i + 16] = d * static_cast<float>(qs[i] >> 4) + m;
  }
}

// Q5_K (176 bytes): as Q4_K with 32 bytes qh before the nibbles; element
// 32 i + l has bit 4 = (qh[l] >> i) & 1.
// The 256 five-bit codes (0..31) of a Q5_K block in element order.
void UnpackQ5_K(const uint8_t* b, int8_t* q) {
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int sub = 0; sub < 8; ++sub) {
    const uint8_t* qj = qs + 32 * (sub / 2);
    const int shift = 4 * (sub % 2);
    for (int l = 0; l < 32; ++l) {
      q[32 * sub + l] = static_cast<int8_t>(((qj[l] >> shift) & 0xF) |
                                            (((qh[l] >> sub) & 1) << 4));
    }
  }
}

void BlockQ5_K(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const float dmin = LoadF16(b + 2);
  int sc[8], mn[8];
  UnpackScaleMin(b + 4, sc, mn);
  int8_t q[kQK_K];
  UnpackQ5_K(b, q);
  for (int e = 0; e < kQK_K; ++e) {
    const float dl = d * static_cast<float>(sc[e / 32]);
    const float ml = dmin * static_cast<float>(mn[e / 32]);
    y[e] = dl * static_cast<float>(q[e]) - ml;
  }
}

// Q6_K (210 bytes): 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16
// int8 scales, f16 d. Element 128 j + 64 k + l (l < 64) has low nibble k of
// ql[64 j + l]; element 128 j + 32 s + l (l < 32) has high bits
// (qh[32 j + l] >> 2s) & 3. y = (d * sc) * (q - 32).
// The 256 codes q - 32 of a Q6_K block, in element order.
void UnpackQ6_K(const uint8_t* b, int8_t* q) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  for (int e = 0; e < kQK_K; ++e) {
    const int j = e / 128;  // half of the super-block
    const int r = e % 128;  // offset inside the half
    const int lo = (ql[64 * j + r % 64] >> (4 * (r / 64))) & 0xF;
    const int hi = (qh[32 * j + r % 32] >> (2 * (r / 32))) & 3;
    q[e] = static_cast<int8_t>((lo | (hi << 4)) - 32);
  }
}

void BlockQ6_K(const uint8_t* b, float* y) {
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = LoadF16(b + 208);
  int8_t q[kQK_K];
  UnpackQ6_K(b, q);
  for (int e = 0; e < kQK_K; ++e) {
    const float dl = d * static_cast<float>(scales[e / 16]);
    y[e] = dl * static_cast<float>(q[e]);
  }
}

// Q5_K_R (40 bytes, Baton's repacked Q5_K and Q5_1): f32 d, f32 m, 32 codes
// 0..31 as bytes; y = (d * q) + m, the same bits as BlockQ5_K / BlockQ5_1.
void BlockQ5_KR(const uint8_t* b, float* y) {
  float d, m;
  std::memcpy(&d, b, sizeof(d));
  std::memcpy(&m, b + 4, sizeof(m));
  for (int i = 0; i < 32; ++i) y[i] = d * static_cast<float>(b[8 + i]) + m;
}

// Q6_K_R (40 bytes, Baton's repacked Q6_K): f32 scales of elements 0-15 and
// 16-31, 32 int8 codes; y = s * q, the same bits as BlockQ6_K.
void BlockQ6_KR(const uint8_t* b, float* y) {
  float sc[2];
  std::memcpy(sc, b, sizeof(sc));
  const int8_t* q = reinterpret_cast<const int8_t*>(b + 8);
  for (int i = 0; i < 32; ++i) y[i] = sc[i / 16] * static_cast<float>(q[i]);
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
    case DType::kQ4_KR:
      return DequantizeBlocks<BlockQ4_KR, kQK, 24>;
    case DType::kQ5_KR:
      return DequantizeBlocks<BlockQ5_KR, kQK, 40>;
    case DType::kQ6_KR:
      return DequantizeBlocks<BlockQ6_KR, kQK, 40>;
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
                   "Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, "
                   "Q4_K_R, Q5_K_R, Q6_K_R)"));
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

namespace quant_blocks {

float F16At(const uint8_t* p) { return LoadF16(p); }
void ScalesAndMins(const uint8_t* s, int sc[8], int mn[8]) {
  UnpackScaleMin(s, sc, mn);
}
void Q5_0Codes(const uint8_t* b, int8_t* q) { UnpackQ5_0(b, q); }
void Q5_1Codes(const uint8_t* b, int8_t* q) { UnpackQ5(b + 4, b + 8, q); }
void Q3_KCodes(const uint8_t* b, int8_t* q, int* sc) { UnpackQ3_K(b, q, sc); }
void Q5_KCodes(const uint8_t* b, int8_t* q) { UnpackQ5_K(b, q); }
void Q6_KCodes(const uint8_t* b, int8_t* q) { UnpackQ6_K(b, q); }

}  // namespace quant_blocks
}  // namespace baton
