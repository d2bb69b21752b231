// The KV blocks of one sequence, in token order.
#ifndef BATON_WORKER_KV_CACHE_BLOCK_TABLE_H_
#define BATON_WORKER_KV_CACHE_BLOCK_TABLE_H_

#include <cstdint>
#include <span>
#include <vector>

namespace baton {

class KvCache;

// Token t of the sequence lives in block block_ids()[t / block_size], slot
// t % block_size. Only the BlockAllocator changes a table (Reserve,
// SetNumTokens, Free, AcquirePrefix).
// A table holds references on its blocks: call KvCache::Free before
// destroying a non-empty table, or its blocks stay in use.
class BlockTable {
 public:
  BlockTable() = default;
  // The moved-from table is empty.
  BlockTable(BlockTable&& other) noexcept;
  // REQUIRES: *this is empty (a non-empty table would leak its blocks).
  BlockTable& operator=(BlockTable&& other) noexcept;
  BlockTable(const BlockTable&) = delete;
  BlockTable& operator=(const BlockTable&) = delete;
  ~BlockTable() = default;

  std::span<const int32_t> block_ids() const { return block_ids_; }
  int64_t num_blocks() const { return static_cast<int64_t>(block_ids_.size()); }
  // Tokens whose K and V are written in every layer (committed by
  // KvCache::SetNumTokens); at most num_blocks() * block_size.
  int64_t num_tokens() const { return num_tokens_; }
  bool empty() const { return block_ids_.empty(); }

 private:
  friend class BlockAllocator;
  friend class KvCache;

  std::vector<int32_t> block_ids_;
  int64_t num_tokens_ = 0;
  // Id of the KvCache whose blocks these are; 0 while empty.
  uint64_t pool_id_ = 0;
};

}  // namespace baton

#endif  // BATON_WORKER_KV_CACHE_BLOCK_TABLE_H_
