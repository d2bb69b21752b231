// Content addresses of full KV blocks for the prefix cache.
//
// A block's hash chains its parent's: hash(block i) = SHA-256(hash(block
// i-1) || its block_size token ids), truncated to 128 bits, and block 0's
// parent is a root derived from everything else that changes the KV (the
// model id, the block size, the storage dtype). Two sequences share block
// i's hash exactly when they share tokens 0 .. (i+1) * block_size - 1 under
// the same root, so equal hashes mean equal K and V (the engine is batch
// invariant). SHA-256 rather than a fast non-cryptographic hash: a client
// that could craft a colliding prompt would read another client's KV.
// The hashes are stable across processes and hosts, so workers can report
// them to a coordinator's index.
#ifndef BATON_WORKER_KV_CACHE_PREFIX_HASH_H_
#define BATON_WORKER_KV_CACHE_PREFIX_HASH_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace baton {

struct BlockHash {
  uint64_t hi = 0;
  uint64_t lo = 0;

  friend bool operator==(const BlockHash& a, const BlockHash& b) {
    return a.hi == b.hi && a.lo == b.lo;
  }
  template <typename H>
  friend H AbslHashValue(H h, const BlockHash& b) {
    return H::combine(std::move(h), b.hi, b.lo);
  }
  // 32 lowercase hex digits.
  std::string ToHex() const;
};

// The parent of every sequence's block 0: a hash of `salt` (e.g. the model
// id and the KV layout, see KvLayout::ToString).
BlockHash PrefixRootHash(std::string_view salt);

// The hash of a full block whose parent hash is `parent`.
BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> tokens);

// Extends `hashes` (the chain of tokens' first hashes->size() full blocks)
// to every full block of `tokens`, up to max_blocks blocks in all.
void ExtendBlockHashes(const BlockHash& root, std::span<const int32_t> tokens,
                       int64_t block_size, int64_t max_blocks,
                       std::vector<BlockHash>* hashes);

// Hashes as bytes for the wire: 16 bytes each, hi then lo, big-endian.
std::string PackHashes(std::span<const BlockHash> hashes);
BlockHash HashFromBytes(std::string_view bytes);  // REQUIRES: 16 bytes
// InvalidArgument naming the length unless it is a multiple of 16.
absl::StatusOr<std::vector<BlockHash>> UnpackHashes(std::string_view bytes);

}  // namespace baton

#endif  // BATON_WORKER_KV_CACHE_PREFIX_HASH_H_
