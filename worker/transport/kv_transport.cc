#include "worker/transport/kv_transport.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "absl/strings/str_cat.h"

namespace baton {

uint64_t KvChecksum(std::span<const uint8_t> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

absl::Status PrefixStatus(absl::string_view prefix,
                          const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

absl::Status ValidateLayerHeader(const KvTransferHeader& header,
                                 const KvTransferTarget& target) {
  const std::string where =
      absl::StrCat("KV transfer ", header.transfer_id, " (request '",
                   header.request_id, "') layer ", header.layer, ": ");
  if (absl::Status s =
          CheckLayoutMatches(target.expected_layout, header.layout);
      !s.ok()) {
    return PrefixStatus(where, s);
  }
  if (!target.expected_model_id.empty() &&
      header.model_id != target.expected_model_id) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "model_id '", header.model_id, "' vs expected '",
                     target.expected_model_id, "'"));
  }
  if (header.layer < 0 || header.layer >= target.expected_layout.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "layer must be in [0, ",
                     target.expected_layout.num_layers, ")"));
  }
  if (header.num_tokens != target.num_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "num_tokens ", header.num_tokens, " vs expected ",
                     target.num_tokens));
  }
  const uint64_t expected_bytes =
      target.cache->LayerBytesForTokens(target.num_tokens);
  if (header.payload_bytes != expected_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "payload_bytes ", header.payload_bytes, " vs expected ",
        expected_bytes, " (", target.num_tokens, " tokens in ",
        target.cache->BlocksNeeded(target.num_tokens), " blocks of ",
        target.cache->chunk_bytes(), " bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace baton
