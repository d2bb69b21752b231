#include "kernels/cpu/repack.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/quant_blocks.h"

namespace baton {
namespace {

using quant_blocks::F16At;

// Output block sizes (bytes per 32 weights) of the internal layouts.
constexpr int kQ4_KRBytes = 24;
constexpr int kQ40Bytes = 40;  // Q5_K_R and Q6_K_R

void PutF32(uint8_t* p, float v) { std::memcpy(p, &v, sizeof(v)); }

// Q4_K_R / Q5_K_R block: d, m, then the codes (nibbles or bytes).
void PutScaleMin(uint8_t* o, float d, float m) {
  PutF32(o, d);
  PutF32(o + 4, m);
}

// Q6_K_R block: the two half-block scales and 32 int8 codes.
void PutHalves(uint8_t* o, float s0, float s1, const int8_t* q) {
  PutF32(o, s0);
  PutF32(o + 4, s1);
  std::memcpy(o + 8, q, 32);
}

// Q4_K (144 bytes): f16 d, f16 dmin, scales, 128 bytes of nibbles; element
// 64 j + 32 k + l is nibble k of qs[32 j + l].
void Q4_KBlock(const uint8_t* b, uint8_t* out) {
  const float d = F16At(b), dmin = F16At(b + 2);
  int sc[8], mn[8];
  quant_blocks::ScalesAndMins(b + 4, sc, mn);
  for (int sub = 0; sub < 8; ++sub) {
    uint8_t* o = out + sub * kQ4_KRBytes;
    PutScaleMin(o, d * static_cast<float>(sc[sub]),
                -(dmin * static_cast<float>(mn[sub])));
    const uint8_t* q = b + 16 + 32 * (sub / 2);
    const int shift = 4 * (sub % 2);
    for (int i = 0; i < 16; ++i) {
      o[8 + i] = static_cast<uint8_t>(((q[i] >> shift) & 0xF) |
                                      (((q[i + 16] >> shift) & 0xF) << 4));
    }
  }
}

void Q5_KBlock(const uint8_t* b, uint8_t* out) {
  const float d = F16At(b), dmin = F16At(b + 2);
  int sc[8], mn[8];
  quant_blocks::ScalesAndMins(b + 4, sc, mn);
  int8_t q[256];
  quant_blocks::Q5_KCodes(b, q);
  for (int sub = 0; sub < 8; ++sub) {
    uint8_t* o = out + sub * kQ40Bytes;
    PutScaleMin(o, d * static_cast<float>(sc[sub]),
                -(dmin * static_cast<float>(mn[sub])));
    std::memcpy(o + 8, q + 32 * sub, 32);
  }
}

void Q5_1Block(const uint8_t* b, uint8_t* out) {
  PutScaleMin(out, F16At(b), F16At(b + 2));
  int8_t q[32];
  quant_blocks::Q5_1Codes(b, q);
  std::memcpy(out + 8, q, 32);
}

void Q6_KBlock(const uint8_t* b, uint8_t* out) {
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = F16At(b + 208);
  int8_t q[256];
  quant_blocks::Q6_KCodes(b, q);
  for (int sub = 0; sub < 8; ++sub) {
    PutHalves(out + sub * kQ40Bytes, d * static_cast<float>(scales[2 * sub]),
              d * static_cast<float>(scales[2 * sub + 1]), q + 32 * sub);
  }
}

void Q3_KBlock(const uint8_t* b, uint8_t* out) {
  const float d = F16At(b + 108);
  int8_t q[256];
  int sc[16];
  quant_blocks::Q3_KCodes(b, q, sc);
  for (int sub = 0; sub < 8; ++sub) {
    PutHalves(out + sub * kQ40Bytes, d * static_cast<float>(sc[2 * sub]),
              d * static_cast<float>(sc[2 * sub + 1]), q + 32 * sub);
  }
}

void Q5_0Block(const uint8_t* b, uint8_t* out) {
  std::memcpy(out, b, 2);  // the same f16 d
  quant_blocks::Q5_0Codes(b, reinterpret_cast<int8_t*>(out + 2));
}

struct Repacker {
  DType from, to;
  void (*block)(const uint8_t* in, uint8_t* out);
};

constexpr Repacker kRepackers[] = {
    {DType::kQ4_K, DType::kQ4_KR, &Q4_KBlock},
    {DType::kQ5_K, DType::kQ5_KR, &Q5_KBlock},
    {DType::kQ5_1, DType::kQ5_KR, &Q5_1Block},
    {DType::kQ6_K, DType::kQ6_KR, &Q6_KBlock},
    {DType::kQ3_K, DType::kQ6_KR, &Q3_KBlock},
    {DType::kQ5_0, DType::kQ8_0, &Q5_0Block},
};

const Repacker* FindRepacker(DType dtype) {
  for (const Repacker& r : kRepackers) {
    if (r.from == dtype) return &r;
  }
  return nullptr;
}

}  // namespace

std::optional<DType> CpuMatMulRepackTarget(DType dtype) {
  const Repacker* r = FindRepacker(dtype);
  if (r == nullptr) return std::nullopt;
  return r->to;
}

absl::StatusOr<std::vector<uint8_t>> RepackForCpuMatMul(
    const TensorView& tensor) {
  const Repacker* r = FindRepacker(tensor.dtype);
  const DTypeInfo* info = FindDTypeInfo(static_cast<uint32_t>(tensor.dtype));
  if (r == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", tensor.name,
        "': ", info != nullptr ? info->name : absl::string_view("its type"),
        " is not repacked for the CPU matmul"));
  }
  BATON_ASSIGN_OR_RETURN(const uint64_t nbytes,
                         TensorBytes(tensor.dtype, tensor.shape));
  if (nbytes != tensor.nbytes || (nbytes > 0 && tensor.data == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor.name, "' of type ", info->name,
                     " and shape ", ShapeToString(tensor.shape), " needs ",
                     nbytes, " bytes, but its view has ", tensor.nbytes));
  }
  const DTypeInfo& out_info = GetDTypeInfo(r->to);
  const uint64_t blocks = nbytes / static_cast<uint64_t>(info->block_bytes);
  const uint64_t out_block_bytes = static_cast<uint64_t>(
      info->block_size / out_info.block_size * out_info.block_bytes);
  std::vector<uint8_t> out(blocks * out_block_bytes);
  for (uint64_t i = 0; i < blocks; ++i) {
    r->block(tensor.data + i * info->block_bytes,
             out.data() + i * out_block_bytes);
  }
  return out;
}

}  // namespace baton
