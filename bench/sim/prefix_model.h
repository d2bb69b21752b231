// The simulated workers' prefix caches, and the coordinator's view of them
// through its own PrefixIndex (coordinator/prefix_index.h), so routing in
// baton-sim weighs cached prefixes exactly as baton-coordinator does.
//
// A prompt's blocks come from its trace: ids of consecutive pieces of
// `piece_tokens` tokens (Mooncake's traces hash 512-token pieces, chained:
// equal ids mean equal prefixes). Block j of block_size tokens lies in
// piece j·block_size / piece_tokens, so its key is (that piece's id, the
// block's index inside the piece); only full blocks are keys, as in the
// engine.
//
// Each worker's cache is an LRU of block keys living in its free KV blocks
// (as the engine's cached-but-unused blocks do): a reservation that takes
// free blocks evicts the least recently used first, and a prompt's blocks
// are stored leaf first so a prefix outlives its extensions. The index
// hears every store and eviction at once (no heartbeat lag).
#ifndef BATON_BENCH_SIM_PREFIX_MODEL_H_
#define BATON_BENCH_SIM_PREFIX_MODEL_H_

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "coordinator/prefix_index.h"
#include "coordinator/routing_policy.h"
#include "worker/kv_cache/prefix_hash.h"

namespace baton::sim {

// The largest piece id and blocks per piece a chain may have: a block's
// key (piece id, 1-based index in its piece) packs into 64 bits in BlockLru.
inline constexpr int64_t kMaxPieceId = (int64_t{1} << 48) - 1;
inline constexpr int64_t kMaxBlocksPerPiece = (int64_t{1} << 16) - 1;

// One worker's cached blocks, least recently used first: a doubly linked
// list threaded through one vector (16 bytes a block: the key packed into
// 64 bits) and a hash set of node indices that hashes and compares the
// nodes' keys (5 bytes a slot), so a simulation of hundreds of workers
// holding millions of blocks stays small. Keys are chains of Chain()
// below (hi <= kMaxPieceId, lo <= kMaxBlocksPerPiece). Not movable: the
// set's hasher points at the nodes.
class BlockLru {
 public:
  // `max_blocks`: the most it keeps (its worker's KV blocks). The nodes are
  // reserved at once, with an eighth more for a prompt stored before the
  // evictions that make room for it, so they never double in a regrowth.
  explicit BlockLru(int64_t max_blocks = 0);
  BlockLru(const BlockLru&) = delete;
  BlockLru& operator=(const BlockLru&) = delete;

  // How many leading blocks of `chain` are held.
  int64_t Match(std::span<const BlockHash> chain) const;
  // Stores (or refreshes) `chain`, leaf first, then evicts down to
  // `capacity`; appends what it newly stored and what it evicted.
  void Store(std::span<const BlockHash> chain, int64_t capacity,
             std::vector<BlockHash>* stored, std::vector<BlockHash>* removed);
  // Evicts least recently used blocks down to `capacity`.
  void Shrink(int64_t capacity, std::vector<BlockHash>* removed);
  int64_t size() const { return static_cast<int64_t>(where_.size()); }

 private:
  static constexpr uint32_t kNone = ~uint32_t{0};
  static uint64_t Pack(const BlockHash& h) { return h.hi << 16 | h.lo; }
  static BlockHash Unpack(uint64_t k) { return {k >> 16, k & 0xffff}; }
  struct Node {
    uint64_t key;
    uint32_t prev = kNone;  // towards the least recently used
    uint32_t next = kNone;
  };
  // A node index stands for its packed key (heterogeneous lookup by key).
  struct KeyHash {
    using is_transparent = void;
    const std::vector<Node>* nodes;
    size_t operator()(uint64_t k) const { return absl::HashOf(k); }
    size_t operator()(uint32_t n) const { return (*this)((*nodes)[n].key); }
  };
  struct KeyEq {
    using is_transparent = void;
    const std::vector<Node>* nodes;
    uint64_t Key(uint64_t k) const { return k; }
    uint64_t Key(uint32_t n) const { return (*nodes)[n].key; }
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return Key(a) == Key(b);
    }
  };
  void Unlink(uint32_t n);
  void PushBack(uint32_t n);  // most recently used

  std::vector<Node> nodes_;
  std::vector<uint32_t> free_;
  uint32_t head_ = kNone;  // least recently used
  uint32_t tail_ = kNone;
  absl::flat_hash_set<uint32_t, KeyHash, KeyEq> where_{0, KeyHash{&nodes_},
                                                       KeyEq{&nodes_}};
};

class PrefixModel {
 public:
  PrefixModel(int64_t block_size, int64_t piece_tokens);

  // Adds a worker (its index is the order of calls) under its routing id,
  // with room for at most `kv_blocks` cached blocks.
  void AddWorker(const std::string& id, int64_t kv_blocks);
  // Full-block keys of a prompt of `input_len` tokens whose pieces have
  // `piece_ids`; empty without ids.
  std::vector<BlockHash> Chain(std::span<const int64_t> piece_ids,
                               int64_t input_len) const;
  // The index's cached tokens of `chain` on each worker of `pool`, for
  // RequestInfo.cached_tokens (workers holding none are left out).
  void Fill(std::span<const BlockHash> chain,
            const coordinator::Candidates& pool,
            coordinator::RequestInfo* info) const;
  // Leading blocks of `chain` worker `w` holds, refreshed as just used.
  int64_t Use(int w, std::span<const BlockHash> chain, int64_t capacity);
  // Stores `chain` on worker `w` within `capacity` blocks.
  void Store(int w, std::span<const BlockHash> chain, int64_t capacity);
  // Evicts down to `capacity` blocks (its free blocks shrank).
  void Shrink(int w, int64_t capacity);
  int64_t CachedBlocks(int w) const;
  int64_t evictions() const { return evictions_; }

 private:
  void Tell(int w, const std::vector<BlockHash>& stored,
            const std::vector<BlockHash>& removed);

  int64_t block_size_;
  int64_t piece_tokens_;
  coordinator::PrefixIndex index_;
  std::deque<BlockLru> lru_;  // a deque: adding one moves none
  std::vector<std::string> ids_;
  int64_t evictions_ = 0;
};

}  // namespace baton::sim

#endif  // BATON_BENCH_SIM_PREFIX_MODEL_H_
