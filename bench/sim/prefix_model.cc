#include "bench/sim/prefix_model.h"

#include <algorithm>

#include "common/check.h"

namespace baton::sim {

BlockLru::BlockLru(int64_t max_blocks) {
  const int64_t n = std::max<int64_t>(0, max_blocks);
  nodes_.reserve(static_cast<size_t>(n + n / 8));
}

int64_t BlockLru::Match(std::span<const BlockHash> chain) const {
  int64_t n = 0;
  for (const BlockHash& h : chain) {
    if (!where_.contains(Pack(h))) break;
    ++n;
  }
  return n;
}

void BlockLru::Unlink(uint32_t n) {
  Node& node = nodes_[n];
  (node.prev == kNone ? head_ : nodes_[node.prev].next) = node.next;
  (node.next == kNone ? tail_ : nodes_[node.next].prev) = node.prev;
  node.prev = node.next = kNone;
}

void BlockLru::PushBack(uint32_t n) {
  Node& node = nodes_[n];
  node.prev = tail_;
  node.next = kNone;
  (tail_ == kNone ? head_ : nodes_[tail_].next) = n;
  tail_ = n;
}

void BlockLru::Store(std::span<const BlockHash> chain, int64_t capacity,
                     std::vector<BlockHash>* stored,
                     std::vector<BlockHash>* removed) {
  // Leaf first, so block 0 ends most recently used and is evicted last.
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const uint64_t key = Pack(*it);
    auto found = where_.find(key);
    if (found != where_.end()) {
      Unlink(*found);
      PushBack(*found);
      continue;
    }
    uint32_t n;
    if (!free_.empty()) {
      n = free_.back();
      free_.pop_back();
    } else {
      n = static_cast<uint32_t>(nodes_.size());
      nodes_.emplace_back();
    }
    nodes_[n].key = key;
    PushBack(n);
    where_.insert(n);
    stored->push_back(*it);
  }
  Shrink(capacity, removed);
}

void BlockLru::Shrink(int64_t capacity, std::vector<BlockHash>* removed) {
  while (size() > std::max<int64_t>(0, capacity)) {
    const uint32_t n = head_;
    removed->push_back(Unpack(nodes_[n].key));
    where_.erase(n);
    Unlink(n);
    free_.push_back(n);
  }
}

PrefixModel::PrefixModel(int64_t block_size, int64_t piece_tokens)
    : block_size_(block_size), piece_tokens_(piece_tokens) {
  BATON_CHECK(block_size_ > 0 && piece_tokens_ > 0 &&
              piece_tokens_ % block_size_ == 0 &&
              piece_tokens_ / block_size_ <= kMaxBlocksPerPiece);
}

void PrefixModel::AddWorker(const std::string& id, int64_t kv_blocks) {
  ids_.push_back(id);
  lru_.emplace_back(kv_blocks);
}

std::vector<BlockHash> PrefixModel::Chain(std::span<const int64_t> piece_ids,
                                          int64_t input_len) const {
  std::vector<BlockHash> chain;
  const int64_t per_piece = piece_tokens_ / block_size_;
  for (int64_t j = 0; (j + 1) * block_size_ <= input_len; ++j) {
    const auto piece = static_cast<size_t>(j / per_piece);
    if (piece >= piece_ids.size()) break;
    BATON_CHECK(piece_ids[piece] >= 0 && piece_ids[piece] <= kMaxPieceId);
    chain.push_back({static_cast<uint64_t>(piece_ids[piece]),
                     static_cast<uint64_t>(j % per_piece) + 1});
  }
  return chain;
}

void PrefixModel::Fill(std::span<const BlockHash> chain,
                       const coordinator::Candidates& pool,
                       coordinator::RequestInfo* info) const {
  if (chain.empty()) return;
  const auto matched = index_.MatchAll(chain);
  if (matched.empty()) return;
  for (const coordinator::WorkerInfo& w : pool) {
    auto it = matched.find(w.ref.id);
    if (it != matched.end()) {
      info->cached_tokens[w.ref.id] = it->second * block_size_;
    }
  }
}

int64_t PrefixModel::Use(int w, std::span<const BlockHash> chain,
                         int64_t capacity) {
  const int64_t hit = lru_[static_cast<size_t>(w)].Match(chain);
  if (hit > 0) Store(w, chain.first(static_cast<size_t>(hit)), capacity);
  return hit;
}

void PrefixModel::Store(int w, std::span<const BlockHash> chain,
                        int64_t capacity) {
  std::vector<BlockHash> stored, removed;
  lru_[static_cast<size_t>(w)].Store(chain, capacity, &stored, &removed);
  Tell(w, stored, removed);
}

void PrefixModel::Shrink(int w, int64_t capacity) {
  std::vector<BlockHash> removed;
  lru_[static_cast<size_t>(w)].Shrink(capacity, &removed);
  Tell(w, {}, removed);
}

int64_t PrefixModel::CachedBlocks(int w) const {
  return lru_[static_cast<size_t>(w)].size();
}

void PrefixModel::Tell(int w, const std::vector<BlockHash>& stored,
                       const std::vector<BlockHash>& removed) {
  evictions_ += static_cast<int64_t>(removed.size());
  if (stored.empty() && removed.empty()) return;
  index_.Apply(ids_[static_cast<size_t>(w)], false, stored, removed);
}

}  // namespace baton::sim
