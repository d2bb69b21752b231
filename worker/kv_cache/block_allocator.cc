#include "worker/kv_cache/block_allocator.h"

#include <atomic>

#include "absl/strings/str_cat.h"

namespace baton {
namespace {

std::atomic<uint64_t> next_pool_id{1};

}  // namespace

BlockAllocator::BlockAllocator(int64_t num_blocks, int64_t block_size)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      pool_id_(next_pool_id.fetch_add(1)),
      ref_counts_(static_cast<size_t>(num_blocks), 0),
      free_ring_(static_cast<size_t>(num_blocks)),
      free_head_(0),
      free_count_(num_blocks),
      lru_prev_(static_cast<size_t>(num_blocks), -1),
      lru_next_(static_cast<size_t>(num_blocks), -1),
      hashes_(static_cast<size_t>(num_blocks)),
      published_(static_cast<size_t>(num_blocks), false) {
  BATON_CHECK(num_blocks >= 1 && block_size >= 1);
  for (int64_t b = 0; b < num_blocks; ++b) {
    free_ring_[static_cast<size_t>(b)] = static_cast<int32_t>(b);
  }
}

int64_t BlockAllocator::BlocksNeeded(int64_t num_tokens) const {
  BATON_CHECK_GE(num_tokens, 0);
  return num_tokens / block_size_ + (num_tokens % block_size_ != 0 ? 1 : 0);
}

bool BlockAllocator::CanReserve(const BlockTable& table,
                                int64_t total_tokens) const {
  CheckOwner(table);
  if (total_tokens < 0) return false;
  return BlocksNeeded(total_tokens) - table.num_blocks() <=
         num_blocks_available();
}

void BlockAllocator::PushFree(int32_t block) {
  BATON_CHECK_LT(free_count_, num_blocks_);
  free_ring_[static_cast<size_t>((free_head_ + free_count_) % num_blocks_)] =
      block;
  ++free_count_;
}

void BlockAllocator::LruPushBack(int32_t block) {
  const size_t b = static_cast<size_t>(block);
  lru_prev_[b] = lru_tail_;
  lru_next_[b] = -1;
  if (lru_tail_ >= 0) {
    lru_next_[static_cast<size_t>(lru_tail_)] = block;
  } else {
    lru_head_ = block;
  }
  lru_tail_ = block;
  ++lru_size_;
}

void BlockAllocator::LruRemove(int32_t block) {
  const size_t b = static_cast<size_t>(block);
  const int32_t prev = lru_prev_[b];
  const int32_t next = lru_next_[b];
  if (prev >= 0) {
    lru_next_[static_cast<size_t>(prev)] = next;
  } else {
    lru_head_ = next;
  }
  if (next >= 0) {
    lru_prev_[static_cast<size_t>(next)] = prev;
  } else {
    lru_tail_ = prev;
  }
  lru_prev_[b] = -1;
  lru_next_[b] = -1;
  --lru_size_;
}

int32_t BlockAllocator::TakeBlock() {
  int32_t block;
  if (free_count_ > 0) {
    block = free_ring_[static_cast<size_t>(free_head_)];
    free_head_ = free_head_ + 1 == num_blocks_ ? 0 : free_head_ + 1;
    --free_count_;
  } else {
    BATON_CHECK_GE(lru_head_, 0) << "no block left to take";
    block = lru_head_;
    LruRemove(block);
    index_.erase(hashes_[static_cast<size_t>(block)]);
    published_[static_cast<size_t>(block)] = false;
    ++evictions_;
    Record(hashes_[static_cast<size_t>(block)], /*stored=*/false);
  }
  BATON_CHECK_EQ(ref_counts_[static_cast<size_t>(block)], 0);
  ref_counts_[static_cast<size_t>(block)] = 1;
  return block;
}

absl::Status BlockAllocator::Reserve(BlockTable& table, int64_t total_tokens) {
  CheckOwner(table);
  if (total_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV reserve: total_tokens must be >= 0, got ", total_tokens));
  }
  const int64_t needed = BlocksNeeded(total_tokens) - table.num_blocks();
  if (needed <= 0) return absl::OkStatus();
  if (needed > num_blocks_available()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV cache full: ", total_tokens, " tokens need ", needed,
        " more blocks (sequence holds ", table.num_blocks(), ", block_size ",
        block_size_, "), ", num_blocks_available(), " of ", num_blocks_,
        " blocks free",
        BlocksNeeded(total_tokens) > num_blocks_ ? " (exceeds the whole pool)"
                                                 : ""));
  }
  table.block_ids_.reserve(static_cast<size_t>(table.num_blocks() + needed));
  for (int64_t i = 0; i < needed; ++i) table.block_ids_.push_back(TakeBlock());
  table.pool_id_ = pool_id_;
  return absl::OkStatus();
}

absl::Status BlockAllocator::SetNumTokens(BlockTable& table,
                                          int64_t num_tokens) {
  CheckOwner(table);
  if (num_tokens < 0 || num_tokens > Capacity(table)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV num_tokens must be in [0, ", Capacity(table),
                     "] (the reserved capacity), got ", num_tokens));
  }
  table.num_tokens_ = num_tokens;
  return absl::OkStatus();
}

void BlockAllocator::Free(BlockTable& table) {
  CheckOwner(table);
  // Empty blocks go to the free list in table order; published ones to the
  // cached list last block first, so a table's tail is evicted before the
  // prefix other sequences may share.
  for (size_t i = table.block_ids_.size(); i-- > 0;) {
    const int32_t block = table.block_ids_[i];
    int32_t& refs = ref_counts_[static_cast<size_t>(block)];
    BATON_CHECK_GT(refs, 0) << "block " << block << " freed more than held";
    if (--refs == 0 && published_[static_cast<size_t>(block)]) {
      LruPushBack(block);
    }
  }
  for (int32_t block : table.block_ids_) {
    if (ref_counts_[static_cast<size_t>(block)] == 0 &&
        !published_[static_cast<size_t>(block)]) {
      PushFree(block);
    }
  }
  table.block_ids_.clear();
  table.num_tokens_ = 0;
  table.pool_id_ = 0;
}

int64_t BlockAllocator::MatchPrefix(std::span<const BlockHash> hashes) const {
  int64_t n = 0;
  for (const BlockHash& h : hashes) {
    if (!index_.contains(h)) break;
    ++n;
  }
  return n;
}

int64_t BlockAllocator::CachedAmong(std::span<const BlockHash> prefix) const {
  int64_t cached = 0;
  for (const BlockHash& h : prefix) {
    auto it = index_.find(h);
    BATON_CHECK(it != index_.end())
        << "prefix block " << h.ToHex() << " is not published";
    if (ref_counts_[static_cast<size_t>(it->second)] == 0) ++cached;
  }
  return cached;
}

bool BlockAllocator::CanReserveWithPrefix(std::span<const BlockHash> prefix,
                                          int64_t total_tokens) const {
  const int64_t shared = static_cast<int64_t>(prefix.size());
  const int64_t fresh = BlocksNeeded(total_tokens) - shared;
  // Acquiring the prefix takes its cached blocks out of the evictable set.
  return fresh <= num_blocks_available() - CachedAmong(prefix);
}

void BlockAllocator::AcquirePrefix(BlockTable& table,
                                   std::span<const BlockHash> prefix) {
  CheckOwner(table);
  BATON_CHECK(table.empty()) << "AcquirePrefix needs an empty table";
  if (prefix.empty()) return;
  table.block_ids_.reserve(prefix.size());
  for (const BlockHash& h : prefix) {
    auto it = index_.find(h);
    BATON_CHECK(it != index_.end())
        << "prefix block " << h.ToHex() << " is not published";
    const int32_t block = it->second;
    int32_t& refs = ref_counts_[static_cast<size_t>(block)];
    if (refs == 0) LruRemove(block);
    ++refs;
    table.block_ids_.push_back(block);
  }
  table.num_tokens_ = static_cast<int64_t>(prefix.size()) * block_size_;
  table.pool_id_ = pool_id_;
}

bool BlockAllocator::Publish(const BlockTable& table, int64_t index,
                             const BlockHash& hash) {
  CheckOwner(table);
  BATON_CHECK(index >= 0 && (index + 1) * block_size_ <= table.num_tokens())
      << "publishing block " << index << " of a table with "
      << table.num_tokens() << " tokens written";
  const int32_t block = table.block_ids_[static_cast<size_t>(index)];
  if (published_[static_cast<size_t>(block)] || index_.contains(hash)) {
    return false;
  }
  published_[static_cast<size_t>(block)] = true;
  hashes_[static_cast<size_t>(block)] = hash;
  index_.emplace(hash, block);
  Record(hash, /*stored=*/true);
  return true;
}

void BlockAllocator::Record(const BlockHash& hash, bool stored) {
  events_.push_back({next_event_seq_++, hash, stored});
  while (events_.size() > event_capacity_) events_.pop_front();
}

bool BlockAllocator::EventsSince(uint64_t after, size_t max,
                                 std::vector<KvCacheEvent>* out) const {
  if (after >= last_event_seq()) return true;
  if (events_.empty() || events_.front().seq > after + 1) return false;
  const size_t first = static_cast<size_t>(after + 1 - events_.front().seq);
  for (size_t i = first; i < events_.size() && max > 0; ++i, --max) {
    out->push_back(events_[i]);
  }
  return true;
}

std::vector<BlockHash> BlockAllocator::PublishedHashes() const {
  std::vector<BlockHash> out;
  out.reserve(index_.size());
  for (const auto& [hash, block] : index_) out.push_back(hash);
  return out;
}

int64_t BlockAllocator::ResetPrefixCache() {
  const int64_t dropped = static_cast<int64_t>(index_.size());
  for (const auto& [hash, block] : index_) {
    published_[static_cast<size_t>(block)] = false;
    Record(hash, /*stored=*/false);
    if (ref_counts_[static_cast<size_t>(block)] == 0) {
      LruRemove(block);
      PushFree(block);
    }
  }
  index_.clear();
  return dropped;
}

absl::Status BlockAllocator::CheckInvariants() const {
  if (free_count_ < 0 || free_count_ > num_blocks_ || free_head_ < 0 ||
      free_head_ >= num_blocks_) {
    return absl::InternalError(
        absl::StrCat("KV free list state out of range: head ", free_head_,
                     ", count ", free_count_, ", total ", num_blocks_));
  }
  std::vector<bool> on_free_list(static_cast<size_t>(num_blocks_), false);
  for (int64_t i = 0; i < free_count_; ++i) {
    const int32_t block =
        free_ring_[static_cast<size_t>((free_head_ + i) % num_blocks_)];
    if (block < 0 || block >= num_blocks_) {
      return absl::InternalError(
          absl::StrCat("KV free list holds invalid block id ", block));
    }
    if (on_free_list[static_cast<size_t>(block)]) {
      return absl::InternalError(
          absl::StrCat("KV free list holds block ", block, " twice"));
    }
    on_free_list[static_cast<size_t>(block)] = true;
  }
  std::vector<bool> on_lru(static_cast<size_t>(num_blocks_), false);
  int64_t lru_seen = 0;
  int32_t prev = -1;
  for (int32_t b = lru_head_; b >= 0; b = lru_next_[static_cast<size_t>(b)]) {
    if (b >= num_blocks_ || on_lru[static_cast<size_t>(b)] ||
        lru_prev_[static_cast<size_t>(b)] != prev || ++lru_seen > num_blocks_) {
      return absl::InternalError(
          absl::StrCat("KV cached list is corrupt at block ", b));
    }
    on_lru[static_cast<size_t>(b)] = true;
    prev = b;
  }
  if (prev != lru_tail_ || lru_seen != lru_size_) {
    return absl::InternalError(absl::StrCat("KV cached list holds ", lru_seen,
                                            " blocks, counted ", lru_size_));
  }
  int64_t used = 0;
  int64_t published = 0;
  for (int64_t b = 0; b < num_blocks_; ++b) {
    const size_t i = static_cast<size_t>(b);
    const int32_t refs = ref_counts_[i];
    const bool cached = refs == 0 && published_[i];
    if (refs < 0 || (refs == 0 && !published_[i]) != on_free_list[i] ||
        cached != on_lru[i]) {
      return absl::InternalError(
          absl::StrCat("KV block ", b, " has reference count ", refs, ", is ",
                       published_[i] ? "" : "not ", "published, and is ",
                       on_free_list[i] ? "" : "not ", "on the free list and ",
                       on_lru[i] ? "" : "not ", "on the cached list"));
    }
    if (published_[i]) {
      ++published;
      auto it = index_.find(hashes_[i]);
      if (it == index_.end() || it->second != b) {
        return absl::InternalError(absl::StrCat(
            "KV block ", b, " is published but the index disagrees"));
      }
    }
    if (refs > 0) ++used;
  }
  if (published != static_cast<int64_t>(index_.size())) {
    return absl::InternalError(absl::StrCat("KV prefix index holds ",
                                            index_.size(), " hashes for ",
                                            published, " published blocks"));
  }
  if (used + free_count_ + lru_size_ != num_blocks_) {
    return absl::InternalError(absl::StrCat(
        "KV accounting: ", used, " used + ", free_count_, " empty + ",
        lru_size_, " cached != ", num_blocks_, " total"));
  }
  return absl::OkStatus();
}

absl::Status BlockAllocator::CheckInvariants(
    std::span<const BlockTable* const> live_tables) const {
  if (absl::Status s = CheckInvariants(); !s.ok()) return s;
  std::vector<int64_t> held(static_cast<size_t>(num_blocks_), 0);
  for (size_t t = 0; t < live_tables.size(); ++t) {
    const BlockTable& table = *live_tables[t];
    if (table.pool_id_ != (table.empty() ? 0 : pool_id_)) {
      return absl::InternalError(
          absl::StrCat("KV table ", t, " is not owned by this cache"));
    }
    if (table.num_tokens() > Capacity(table)) {
      return absl::InternalError(absl::StrCat("KV table ", t, " has ",
                                              table.num_tokens(), " tokens in ",
                                              table.num_blocks(), " blocks"));
    }
    for (int32_t block : table.block_ids()) {
      if (block < 0 || block >= num_blocks_) {
        return absl::InternalError(
            absl::StrCat("KV table ", t, " holds invalid block id ", block));
      }
      ++held[static_cast<size_t>(block)];
    }
  }
  for (int64_t b = 0; b < num_blocks_; ++b) {
    if (held[static_cast<size_t>(b)] != ref_counts_[static_cast<size_t>(b)]) {
      return absl::InternalError(absl::StrCat(
          "KV block ", b, " has reference count ",
          ref_counts_[static_cast<size_t>(b)], " but live tables hold it ",
          held[static_cast<size_t>(b)], " times"));
    }
  }
  return absl::OkStatus();
}

}  // namespace baton
