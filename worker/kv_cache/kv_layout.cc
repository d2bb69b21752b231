#include "worker/kv_cache/kv_layout.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace baton {
namespace {

absl::Status CheckRange(absl::string_view field, int64_t value, int64_t max) {
  if (value < 1 || value > max) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache ", field, " must be in [1, ", max, "], got ", value));
  }
  return absl::OkStatus();
}

absl::string_view KvDTypeName(DType dtype) {
  if (dtype == DType::kF16) return "F16";
  if (dtype == DType::kF32) return "F32";
  return "unsupported";
}

}  // namespace

absl::Status KvLayout::Validate() const {
  BATON_RETURN_IF_ERROR(CheckRange("num_layers", num_layers, kKvMaxNumLayers));
  BATON_RETURN_IF_ERROR(
      CheckRange("num_kv_heads", num_kv_heads, kKvMaxNumKvHeads));
  BATON_RETURN_IF_ERROR(CheckRange("head_dim", head_dim, kKvMaxHeadDim));
  BATON_RETURN_IF_ERROR(CheckRange("block_size", block_size, kKvMaxBlockSize));
  if (dtype != DType::kF16 && dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache dtype must be F16 or F32, got ggml type id ",
                     static_cast<uint32_t>(dtype)));
  }
  return absl::OkStatus();
}

std::string KvLayout::ToString() const {
  std::string dtype_name(KvDTypeName(dtype));
  if (dtype != DType::kF16 && dtype != DType::kF32) {
    absl::StrAppend(&dtype_name, "(", static_cast<uint32_t>(dtype), ")");
  }
  return absl::StrCat("KvLayout{layers=", num_layers,
                      ", kv_heads=", num_kv_heads, ", head_dim=", head_dim,
                      ", block_size=", block_size, ", dtype=", dtype_name,
                      ", chunk_bytes=", chunk_bytes(), "}");
}

absl::Status CheckLayoutMatches(const KvLayout& expected,
                                const KvLayout& received) {
  if (received == expected) return absl::OkStatus();
  std::vector<std::string> diffs;
  auto compare = [&](absl::string_view field, int64_t got, int64_t want) {
    if (got != want) {
      diffs.push_back(absl::StrCat(field, " ", got, " vs expected ", want));
    }
  };
  compare("num_layers", received.num_layers, expected.num_layers);
  compare("num_kv_heads", received.num_kv_heads, expected.num_kv_heads);
  compare("head_dim", received.head_dim, expected.head_dim);
  compare("block_size", received.block_size, expected.block_size);
  if (received.dtype != expected.dtype) {
    diffs.push_back(absl::StrCat("dtype ", KvDTypeName(received.dtype),
                                 " vs expected ", KvDTypeName(expected.dtype)));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("KV layout mismatch (wrong model or cache layout): ",
                   absl::StrJoin(diffs, ", "), "; received ",
                   received.ToString(), ", expected ", expected.ToString()));
}

}  // namespace baton
