#include "worker/kv_cache/prefix_hash.h"

#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"

namespace baton {
namespace {

BlockHash FromDigest(const std::array<unsigned char, 32>& digest) {
  BlockHash h;
  for (int i = 0; i < 8; ++i) {
    h.hi = (h.hi << 8) | digest[static_cast<size_t>(i)];
    h.lo = (h.lo << 8) | digest[static_cast<size_t>(8 + i)];
  }
  return h;
}

void PutU64(uint64_t v, unsigned char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}

std::array<unsigned char, 32> Sha256(const unsigned char* data, size_t size) {
  std::array<unsigned char, 32> digest{};
  unsigned int len = 0;
  BATON_CHECK(
      EVP_Digest(data, size, digest.data(), &len, EVP_sha256(), nullptr) == 1 &&
      len == digest.size())
      << "SHA-256 failed";
  return digest;
}

}  // namespace

std::string BlockHash::ToHex() const {
  return absl::StrFormat("%016x%016x", hi, lo);
}

BlockHash PrefixRootHash(std::string_view salt) {
  std::vector<unsigned char> bytes(salt.size() + 1);
  bytes[0] = 'R';  // a root never equals a block's input
  std::memcpy(bytes.data() + 1, salt.data(), salt.size());
  return FromDigest(Sha256(bytes.data(), bytes.size()));
}

BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> tokens) {
  // 'B' || parent (16 bytes, little-endian halves) || token ids (4 bytes
  // each, little-endian): the same bytes on every host.
  std::vector<unsigned char> bytes(1 + 16 + 4 * tokens.size());
  bytes[0] = 'B';
  PutU64(parent.hi, bytes.data() + 1);
  PutU64(parent.lo, bytes.data() + 9);
  unsigned char* out = bytes.data() + 17;
  for (int32_t t : tokens) {
    const uint32_t u = static_cast<uint32_t>(t);
    for (int i = 0; i < 4; ++i)
      *out++ = static_cast<unsigned char>(u >> (8 * i));
  }
  return FromDigest(Sha256(bytes.data(), bytes.size()));
}

void ExtendBlockHashes(const BlockHash& root, std::span<const int32_t> tokens,
                       int64_t block_size, int64_t max_blocks,
                       std::vector<BlockHash>* hashes) {
  BATON_CHECK_GT(block_size, 0);
  const int64_t full = std::min<int64_t>(
      static_cast<int64_t>(tokens.size()) / block_size, max_blocks);
  for (int64_t i = static_cast<int64_t>(hashes->size()); i < full; ++i) {
    const BlockHash& parent =
        i == 0 ? root : (*hashes)[static_cast<size_t>(i - 1)];
    hashes->push_back(
        HashBlock(parent, tokens.subspan(static_cast<size_t>(i * block_size),
                                         static_cast<size_t>(block_size))));
  }
}

std::string PackHashes(std::span<const BlockHash> hashes) {
  std::string out(hashes.size() * 16, '\0');
  for (size_t i = 0; i < hashes.size(); ++i) {
    for (int b = 0; b < 8; ++b) {
      out[i * 16 + static_cast<size_t>(b)] =
          static_cast<char>(hashes[i].hi >> (56 - 8 * b));
      out[i * 16 + 8 + static_cast<size_t>(b)] =
          static_cast<char>(hashes[i].lo >> (56 - 8 * b));
    }
  }
  return out;
}

BlockHash HashFromBytes(std::string_view bytes) {
  BATON_CHECK_EQ(bytes.size(), 16u);
  BlockHash h;
  for (int b = 0; b < 8; ++b) {
    h.hi =
        (h.hi << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(b)]);
    h.lo = (h.lo << 8) |
           static_cast<unsigned char>(bytes[static_cast<size_t>(8 + b)]);
  }
  return h;
}

absl::StatusOr<std::vector<BlockHash>> UnpackHashes(std::string_view bytes) {
  if (bytes.size() % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed block hashes must be a multiple of 16 bytes, got ",
                     bytes.size()));
  }
  std::vector<BlockHash> out;
  out.reserve(bytes.size() / 16);
  for (size_t i = 0; i < bytes.size(); i += 16) {
    out.push_back(HashFromBytes(bytes.substr(i, 16)));
  }
  return out;
}

}  // namespace baton
