// The KV block allocator of one worker: block ids, reference counts, block
// tables, accounting and the prefix index. It knows nothing of the bytes
// (KvCache owns the storage and delegates allocation here), so the prefix
// cache, the transports and a device runner each see only what they need.
//
// Every block is in exactly one state:
//   empty   reference count 0, no content worth keeping (the free list);
//   cached  reference count 0, but it holds a full block of KV published
//           under its content hash (prefix_hash.h): a later sequence with
//           the same prefix reuses it, and Reserve evicts it, least
//           recently freed first, only when no empty block is left;
//   used    held by at least one block table (a published block may be
//           shared by several; nobody writes into a published block).
// empty + cached + used == total after every call.
//
// Thread safety: none; the owner serializes every call.
#ifndef BATON_WORKER_KV_CACHE_BLOCK_ALLOCATOR_H_
#define BATON_WORKER_KV_CACHE_BLOCK_ALLOCATOR_H_

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/check.h"
#include "worker/kv_cache/block_table.h"
#include "worker/kv_cache/prefix_hash.h"

namespace baton {

// A change to the set of published blocks, numbered from 1 in order.
struct KvCacheEvent {
  uint64_t seq = 0;
  BlockHash hash;
  bool stored = false;  // true: published; false: evicted or reset
};

class BlockAllocator {
 public:
  // REQUIRES: num_blocks in [1, 2^31 - 1], block_size >= 1.
  BlockAllocator(int64_t num_blocks, int64_t block_size);
  BlockAllocator(const BlockAllocator&) = delete;
  BlockAllocator& operator=(const BlockAllocator&) = delete;

  int64_t block_size() const { return block_size_; }

  // --- Accounting ---
  int64_t num_blocks_total() const { return num_blocks_; }
  int64_t num_blocks_empty() const { return free_count_; }
  int64_t num_blocks_cached() const { return lru_size_; }
  int64_t num_blocks_used() const {
    return num_blocks_ - free_count_ - lru_size_;
  }
  // Blocks a Reserve may take: empty + cached.
  int64_t num_blocks_available() const { return free_count_ + lru_size_; }
  // Cached blocks Reserve has evicted so far.
  int64_t num_evictions() const { return evictions_; }
  // ceil(num_tokens / block_size). REQUIRES: num_tokens >= 0.
  int64_t BlocksNeeded(int64_t num_tokens) const;
  int64_t Capacity(const BlockTable& table) const {
    return table.num_blocks() * block_size_;
  }

  // --- Allocation ---
  // True if Reserve(table, total_tokens) would succeed.
  bool CanReserve(const BlockTable& table, int64_t total_tokens) const;
  // Grows `table` to hold at least total_tokens tokens (never shrinks),
  // taking empty blocks first (from the front of the free list, which
  // starts 0, 1, ... and gets freed blocks at its back, so a given sequence
  // of calls yields the same block ids), then evicting cached ones.
  // ResourceExhausted with the numbers if the pool lacks the blocks,
  // InvalidArgument if total_tokens < 0; on error nothing changes.
  absl::Status Reserve(BlockTable& table, int64_t total_tokens);
  // Commits that the table's first num_tokens tokens are written.
  // InvalidArgument unless 0 <= num_tokens <= Capacity(table).
  absl::Status SetNumTokens(BlockTable& table, int64_t num_tokens);
  // Drops the table's reference on each of its blocks and empties it. A
  // block whose last reference goes becomes cached if it is published
  // (the table's last block first in eviction order, so a shared prefix
  // outlives its tails), empty otherwise.
  void Free(BlockTable& table);

  // --- Prefix cache ---
  // How many of `hashes` (a chain, block 0 first) are published, counting
  // from the front until the first one that is not.
  int64_t MatchPrefix(std::span<const BlockHash> hashes) const;
  // True if AcquirePrefix(table, prefix) then Reserve(table, total_tokens)
  // would succeed. REQUIRES: MatchPrefix(prefix) == prefix.size().
  bool CanReserveWithPrefix(std::span<const BlockHash> prefix,
                            int64_t total_tokens) const;
  // Appends the published blocks of `prefix` to an empty table (one more
  // reference each, no copy) and marks their tokens written.
  // REQUIRES: table empty, MatchPrefix(prefix) == prefix.size().
  void AcquirePrefix(BlockTable& table, std::span<const BlockHash> prefix);
  // Publishes block `index` of the table (full: its block_size tokens are
  // committed) under `hash`. False, changing nothing, if that hash is
  // published already (by this or another block) or the block has a hash.
  bool Publish(const BlockTable& table, int64_t index, const BlockHash& hash);
  // Unpublishes every block (cached ones become empty); returns how many.
  int64_t ResetPrefixCache();

  // --- Cache events (what a coordinator's prefix index follows) ---
  // The last `event_log_capacity` events are kept.
  void set_event_log_capacity(size_t capacity) { event_capacity_ = capacity; }
  // Number of the latest event (0: none yet).
  uint64_t last_event_seq() const { return next_event_seq_ - 1; }
  // Appends to *out the events numbered after `after`, at most `max`; false
  // (appending nothing) if the log no longer holds all of them: the reader
  // then starts over from PublishedHashes() as of last_event_seq().
  bool EventsSince(uint64_t after, size_t max,
                   std::vector<KvCacheEvent>* out) const;
  // Every published hash (the state all events so far add up to).
  std::vector<BlockHash> PublishedHashes() const;

  // --- Checks for tests ---
  // The lists hold each block at most once, in range; a block is on the
  // free list iff it is empty and on the cached list iff it is cached; the
  // index and the blocks' hashes agree; the counts add up to the total.
  absl::Status CheckInvariants() const;
  // CheckInvariants plus ownership: every block's reference count equals
  // the number of times the live tables hold it.
  absl::Status CheckInvariants(
      std::span<const BlockTable* const> live_tables) const;

  uint64_t pool_id() const { return pool_id_; }
  void CheckOwner(const BlockTable& table) const {
    BATON_CHECK(table.pool_id_ == 0 || table.pool_id_ == pool_id_)
        << "BlockTable belongs to another pool";
  }

 private:
  int32_t TakeBlock();  // REQUIRES: num_blocks_available() > 0
  void PushFree(int32_t block);
  void LruPushBack(int32_t block);
  void LruRemove(int32_t block);
  int64_t CachedAmong(std::span<const BlockHash> prefix) const;
  void Record(const BlockHash& hash, bool stored);

  int64_t num_blocks_;
  int64_t block_size_;
  uint64_t pool_id_;
  std::vector<int32_t> ref_counts_;  // 0 = empty or cached
  // Empty blocks as a FIFO ring of capacity num_blocks_: entries
  // free_ring_[(free_head_ + i) % num_blocks_] for i < free_count_.
  std::vector<int32_t> free_ring_;
  int64_t free_head_ = 0;
  int64_t free_count_ = 0;
  // Cached blocks, least recently freed first (intrusive list, -1 = none).
  std::vector<int32_t> lru_prev_;
  std::vector<int32_t> lru_next_;
  int32_t lru_head_ = -1;
  int32_t lru_tail_ = -1;
  int64_t lru_size_ = 0;
  // Published blocks: the hash of each (valid where published_[b]) and the
  // index from hash to block.
  std::vector<BlockHash> hashes_;
  std::vector<bool> published_;
  absl::flat_hash_map<BlockHash, int32_t> index_;
  int64_t evictions_ = 0;
  std::deque<KvCacheEvent> events_;
  size_t event_capacity_ = 1 << 16;
  uint64_t next_event_seq_ = 1;
};

}  // namespace baton

#endif  // BATON_WORKER_KV_CACHE_BLOCK_ALLOCATOR_H_
