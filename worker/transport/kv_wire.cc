#include "worker/transport/kv_wire.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace baton {
namespace {

template <typename T>
void Put(uint8_t* out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    out[i] = static_cast<uint8_t>(static_cast<uint64_t>(value) >> (8 * i));
  }
}

template <typename T>
T Get(const uint8_t* in) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    v |= static_cast<uint64_t>(in[i]) << (8 * i);
  }
  return static_cast<T>(v);
}

}  // namespace

KvFrameBytes EncodeKvFrame(const KvFrame& frame) {
  KvFrameBytes b{};
  const KvTransferHeader& h = frame.header;
  Put<uint32_t>(&b[0], kKvWireMagic);
  Put<uint16_t>(&b[4], kKvWireVersion);
  Put<uint16_t>(&b[6], static_cast<uint16_t>(frame.kind));
  Put<uint64_t>(&b[8], h.transfer_id);
  Put<uint32_t>(&b[16], static_cast<uint32_t>(h.layer));
  Put<uint32_t>(&b[20], static_cast<uint32_t>(h.layout.num_layers));
  Put<uint32_t>(&b[24], static_cast<uint32_t>(h.layout.num_kv_heads));
  Put<uint32_t>(&b[28], static_cast<uint32_t>(h.layout.head_dim));
  Put<uint32_t>(&b[32], static_cast<uint32_t>(h.layout.block_size));
  Put<uint32_t>(&b[36], static_cast<uint32_t>(h.layout.dtype));
  Put<uint64_t>(&b[40], static_cast<uint64_t>(h.num_tokens));
  Put<uint64_t>(&b[48], h.payload_bytes);
  Put<uint64_t>(&b[56], static_cast<uint64_t>(h.first_block));
  Put<uint16_t>(&b[64], static_cast<uint16_t>(h.request_id.size()));
  Put<uint16_t>(&b[66], static_cast<uint16_t>(h.model_id.size()));
  Put<uint32_t>(&b[68], frame.status_code);
  return b;
}

absl::StatusOr<KvFrame> DecodeKvFrame(
    std::span<const uint8_t, kKvFrameHeaderBytes> bytes) {
  const uint8_t* b = bytes.data();
  const uint32_t magic = Get<uint32_t>(b);
  if (magic != kKvWireMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV frame: magic 0x", absl::Hex(magic), " vs expected 0x",
                     absl::Hex(kKvWireMagic)));
  }
  const uint16_t version = Get<uint16_t>(b + 4);
  if (version != kKvWireVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV frame: version ", version, " vs supported ", kKvWireVersion));
  }
  KvFrame f;
  const uint16_t kind = Get<uint16_t>(b + 6);
  if (kind < 1 || kind > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV frame: kind ", kind, " must be in [1, 8]"));
  }
  f.kind = static_cast<KvFrameKind>(kind);
  KvTransferHeader& h = f.header;
  h.transfer_id = Get<uint64_t>(b + 8);
  h.layer = Get<uint32_t>(b + 16);
  h.layout.num_layers = Get<uint32_t>(b + 20);
  h.layout.num_kv_heads = Get<uint32_t>(b + 24);
  h.layout.head_dim = Get<uint32_t>(b + 28);
  h.layout.block_size = Get<uint32_t>(b + 32);
  h.layout.dtype = static_cast<DType>(Get<uint32_t>(b + 36));
  h.num_tokens = static_cast<int64_t>(Get<uint64_t>(b + 40));
  h.payload_bytes = Get<uint64_t>(b + 48);
  h.first_block = static_cast<int64_t>(Get<uint64_t>(b + 56));
  f.request_id_bytes = Get<uint16_t>(b + 64);
  f.model_id_bytes = Get<uint16_t>(b + 66);
  f.status_code = Get<uint32_t>(b + 68);
  if (f.request_id_bytes > kKvMaxIdBytes || f.model_id_bytes > kKvMaxIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV frame: request_id length ", f.request_id_bytes,
                     " / model_id length ", f.model_id_bytes,
                     " must be <= ", kKvMaxIdBytes));
  }
  if (f.kind == KvFrameKind::kLayer || f.kind == KvFrameKind::kSimulatedLayer) {
    if (absl::Status s = h.layout.Validate(); !s.ok()) return s;
    if (h.num_tokens < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV frame: num_tokens ", h.num_tokens, " must be >= 0"));
    }
    const int64_t bs = h.layout.block_size;
    const int64_t blocks = h.num_tokens / bs + (h.num_tokens % bs != 0);
    if (h.first_block < 0 || (h.first_block > 0 && h.first_block >= blocks)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV frame: first_block ", h.first_block, " must be in [0, ", blocks,
          ") (", h.num_tokens, " tokens; a layer carries at least one block)"));
    }
  } else if (h.first_block != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV frame: first_block ", h.first_block,
                     " must be 0 in a ", static_cast<int>(f.kind), " frame"));
  } else if (f.kind == KvFrameKind::kFinish || f.kind == KvFrameKind::kHello) {
    if (h.payload_bytes != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV frame: finish/hello payload_bytes ", h.payload_bytes,
                       " must be 0"));
    }
  } else if (f.kind == KvFrameKind::kChallenge ||
             f.kind == KvFrameKind::kProof) {
    if (h.payload_bytes != kKvNonceBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV frame: challenge/proof payload_bytes ",
                       h.payload_bytes, " must be ", kKvNonceBytes));
    }
  } else if (f.status_code > 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV frame: status code ", f.status_code, " must be in [0, 16]"));
  } else if (h.payload_bytes > kKvMaxMessageBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV frame: status message of ", h.payload_bytes,
                     " bytes exceeds ", kKvMaxMessageBytes));
  }
  return f;
}

KvTrailerBytes EncodeKvTrailer(uint64_t checksum) {
  KvTrailerBytes b{};
  Put<uint64_t>(b.data(), checksum);
  return b;
}

KvNonce NewKvNonce() {
  KvNonce nonce{};
  BATON_CHECK_EQ(RAND_bytes(nonce.data(), static_cast<int>(nonce.size())), 1);
  return nonce;
}

uint64_t NewKvTransferId() {
  uint64_t id = 0;
  while (id == 0) {
    uint8_t bytes[8];
    BATON_CHECK_EQ(RAND_bytes(bytes, sizeof(bytes)), 1);
    id = Get<uint64_t>(bytes);
  }
  return id;
}

std::string NewKvSecret() {
  std::string secret(kKvSecretBytes, '\0');
  BATON_CHECK_EQ(RAND_bytes(reinterpret_cast<uint8_t*>(secret.data()),
                            static_cast<int>(secret.size())),
                 1);
  return secret;
}

KvProofBytes KvProof(absl::string_view secret, const KvNonce& nonce,
                     uint64_t transfer_id) {
  static constexpr char kLabel[] = "baton-kv-proof-v1";
  std::array<uint8_t, sizeof(kLabel) - 1 + kKvNonceBytes + 8> message{};
  std::copy(kLabel, kLabel + sizeof(kLabel) - 1, message.begin());
  std::copy(nonce.begin(), nonce.end(), message.begin() + sizeof(kLabel) - 1);
  Put<uint64_t>(message.data() + sizeof(kLabel) - 1 + kKvNonceBytes,
                transfer_id);
  KvProofBytes proof{};
  unsigned int length = 0;
  BATON_CHECK(HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
                   message.data(), message.size(), proof.data(),
                   &length) != nullptr);
  BATON_CHECK_EQ(length, proof.size());
  return proof;
}

bool KvSecretsMatch(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() &&
         CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

bool KvProofMatches(absl::string_view secret, const KvNonce& nonce,
                    uint64_t transfer_id, std::span<const uint8_t> proof) {
  if (proof.size() != kKvProofBytes) return false;
  const KvProofBytes expected = KvProof(secret, nonce, transfer_id);
  return CRYPTO_memcmp(expected.data(), proof.data(), kKvProofBytes) == 0;
}

uint64_t DecodeKvTrailer(std::span<const uint8_t, kKvTrailerBytes> bytes) {
  return Get<uint64_t>(bytes.data());
}

}  // namespace baton
