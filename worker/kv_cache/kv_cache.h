// The paged KV cache of one worker: a fixed pool of blocks of `block_size`
// tokens (the bytes), handed to sequences through BlockTables by its
// BlockAllocator (ids, reference counts, the prefix index; vLLM style),
// laid out layer-major so one layer of a sequence can be exported while later
// layers are still being computed. The byte layout is documented in
// kv_layout.h.
//
// Thread safety: none inside. Calls that change allocation state (Reserve,
// SetNumTokens, Free) need external synchronization with every other call.
// Data calls (WriteKv, ReadKv, ExportLayer, ImportLayer, views) only read the
// allocation state, so they may run concurrently with each other as long as
// no two touch the same (layer, block) bytes with one of them writing.
#ifndef BATON_WORKER_KV_CACHE_KV_CACHE_H_
#define BATON_WORKER_KV_CACHE_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/check.h"
#include "model/tensor.h"
#include "worker/kv_cache/block_allocator.h"
#include "worker/kv_cache/block_table.h"
#include "worker/kv_cache/kv_layout.h"
#include "worker/kv_cache/kv_pool_memory.h"

namespace baton {

struct KvCacheOptions {
  // --- Model shape (ModelConfig::num_layers / num_kv_heads / head_dim) ---
  // Transformer layers, in [1, kKvMaxNumLayers].
  int64_t num_layers = 0;
  // KV heads per layer (GQA), in [1, kKvMaxNumKvHeads].
  int64_t num_kv_heads = 0;
  // Elements per head, in [1, kKvMaxHeadDim].
  int64_t head_dim = 0;

  // --- Behaviour ---
  // Tokens per block, in [1, kKvMaxBlockSize]. Sender and receiver of a
  // transfer must agree.
  int64_t block_size = 16;
  // Storage element type: kF16 or kF32 (exact, for reference runs).
  DType dtype = DType::kF16;

  // --- Size: set exactly one of num_blocks and max_bytes ---
  // Blocks in the pool, in [1, 2^31 - 1].
  int64_t num_blocks = 0;
  // Byte budget for the pool; num_blocks = max_bytes / (num_layers *
  // chunk_bytes), which must be at least 1.
  uint64_t max_bytes = 0;

  // --- Performance ---
  // Touch every page at Create so no later write or import pays page
  // faults (Create then takes about one memset of the pool). Off: pages are
  // committed on first use.
  bool prefault = false;

  // --- Storage ---
  // False: the cache is the allocator and layout of a pool whose bytes live
  // elsewhere (a device runner's pool, ForwardRunner::device_kv_pool): no
  // host memory is mapped, and every call that reads or writes KV bytes
  // (LayerBlock, WriteKv, ExportLayer, LayerChunks, ...) is a programming
  // error.
  bool host_storage = true;
};

// Options for a pool of num_blocks blocks of `layout` (e.g. a staging pool
// beside another cache).
KvCacheOptions KvCacheOptionsFor(const KvLayout& layout, int64_t num_blocks);

// Read view of one layer of the pool for an attention kernel walking a
// sequence's blocks in order. Keys(b, h) points at [block_size][head_dim]
// elements: key of slot t, dimension d is Keys(b, h)[t * head_dim + d].
// Pointers stay valid for the KvCache's lifetime.
struct KvLayerView {
  const uint8_t* base = nullptr;  // chunk (layer, block 0)
  DType dtype = DType::kF16;
  int64_t block_size = 0;
  int64_t head_dim = 0;
  uint64_t chunk_bytes = 0;   // stride between consecutive block ids
  uint64_t head_bytes = 0;    // stride between heads inside K or V
  uint64_t value_offset = 0;  // bytes from a block's K to its V

  const uint8_t* KeyBytes(int32_t block, int64_t head) const {
    return base + static_cast<uint64_t>(block) * chunk_bytes +
           static_cast<uint64_t>(head) * head_bytes;
  }
  const uint8_t* ValueBytes(int32_t block, int64_t head) const {
    return KeyBytes(block, head) + value_offset;
  }
  // T is uint16_t (F16 bits) or float, matching dtype.
  template <typename T>
  const T* Keys(int32_t block, int64_t head) const {
    return reinterpret_cast<const T*>(KeyBytes(block, head));
  }
  template <typename T>
  const T* Values(int32_t block, int64_t head) const {
    return reinterpret_cast<const T*>(ValueBytes(block, head));
  }
};

class KvCache {
 public:
  // InvalidArgument naming the first bad field and its allowed range;
  // ResourceExhausted naming the bytes if the pool cannot be allocated.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(
      const KvCacheOptions& options);

  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;
  ~KvCache() = default;

  const KvLayout& layout() const { return layout_; }
  int64_t block_size() const { return layout_.block_size; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  // Bytes of the whole pool: num_layers * num_blocks_total * chunk_bytes
  // (mapped on the host only when has_host_storage()).
  uint64_t pool_bytes() const { return pool_bytes_; }
  // KvCacheOptions::host_storage.
  bool has_host_storage() const { return memory_ != nullptr; }
  // The host bytes of the pool; REQUIRES: has_host_storage().
  const uint8_t* pool_data() const;
  // Unmaps the host bytes (their KV lives elsewhere from now on, e.g. in a
  // device runner's pool); has_host_storage() is false afterwards.
  void DropHostStorage() { memory_.reset(); }

  // --- Accounting (BlockAllocator): num_blocks_free() counts the blocks
  // no sequence holds, empty or cached; num_blocks_free() +
  // num_blocks_used() == num_blocks_total() ---
  int64_t num_blocks_total() const { return allocator_.num_blocks_total(); }
  int64_t num_blocks_free() const { return allocator_.num_blocks_available(); }
  int64_t num_blocks_used() const { return allocator_.num_blocks_used(); }
  // The free blocks that hold a published prefix block (evictable).
  int64_t num_blocks_cached() const { return allocator_.num_blocks_cached(); }
  // ceil(num_tokens / block_size). REQUIRES: num_tokens >= 0.
  int64_t BlocksNeeded(int64_t num_tokens) const {
    return allocator_.BlocksNeeded(num_tokens);
  }
  // Tokens the table's blocks can hold: num_blocks * block_size.
  int64_t Capacity(const BlockTable& table) const {
    return allocator_.Capacity(table);
  }

  // --- Allocation (BlockAllocator; see there) ---
  BlockAllocator& allocator() { return allocator_; }
  const BlockAllocator& allocator() const { return allocator_; }
  bool CanReserve(const BlockTable& table, int64_t total_tokens) const {
    return allocator_.CanReserve(table, total_tokens);
  }
  absl::Status Reserve(BlockTable& table, int64_t total_tokens) {
    return allocator_.Reserve(table, total_tokens);
  }
  absl::Status SetNumTokens(BlockTable& table, int64_t num_tokens) {
    return allocator_.SetNumTokens(table, num_tokens);
  }
  void Free(BlockTable& table) { allocator_.Free(table); }

  // --- Addressing ---
  // The chunk of (layer, block): K then V, chunk_bytes() contiguous bytes.
  // REQUIRES: 0 <= layer < num_layers, 0 <= block < num_blocks_total().
  uint8_t* LayerBlock(int64_t layer, int32_t block);
  const uint8_t* LayerBlock(int64_t layer, int32_t block) const;
  // REQUIRES: 0 <= layer < num_layers.
  KvLayerView LayerView(int64_t layer) const;

  // Stores K and V of token `position` of the sequence in `layer`,
  // converting to the storage dtype (F16: round to nearest even).
  // k, v: [kv_dim] = [num_kv_heads][head_dim] floats.
  // REQUIRES: 0 <= position < Capacity(table), valid layer.
  void WriteKv(const BlockTable& table, int64_t layer, int64_t position,
               const float* k, const float* v);
  // WriteKv for positions first .. first+count-1; k, v: [count][kv_dim].
  void WriteKvRange(const BlockTable& table, int64_t layer, int64_t first,
                    int64_t count, const float* k, const float* v);
  // Inverse of WriteKv (F16 values widened exactly). k, v: [kv_dim].
  void ReadKv(const BlockTable& table, int64_t layer, int64_t position,
              float* k, float* v) const;

  // --- Transfer (one layer at a time) ---
  // Bytes of one layer of the sequence's written tokens:
  // BlocksNeeded(table.num_tokens()) * chunk_bytes().
  uint64_t LayerBytes(const BlockTable& table) const;
  uint64_t LayerBytesForTokens(int64_t num_tokens) const;
  // Concatenates the chunks of `layer` of the first
  // BlocksNeeded(table.num_tokens()) blocks, in table order, into `out`.
  // InvalidArgument if layer is out of range or out.size() !=
  // LayerBytes(table) (stating expected and actual).
  absl::Status ExportLayer(const BlockTable& table, int64_t layer,
                           std::span<uint8_t> out) const;
  // Inverse of ExportLayer on the receiving side: `in` holds num_tokens
  // tokens of `layer` from a peer whose layout equals layout() (check with
  // CheckLayoutMatches first). The table must have been reserved for at
  // least num_tokens tokens; num_tokens is not committed (call SetNumTokens
  // once every layer has arrived). InvalidArgument for a bad layer, a
  // num_tokens the table cannot hold, or in.size() != LayerBytesForTokens(
  // num_tokens) (stating expected and actual); nothing is written then.
  absl::Status ImportLayer(const BlockTable& table, int64_t layer,
                           int64_t num_tokens, std::span<const uint8_t> in);

  // The chunks of `layer` of the table's blocks [first_block,
  // BlocksNeeded(num_tokens)), in table order, each chunk_bytes() long: from
  // block 0 concatenated they are what ExportLayer writes / ImportLayer
  // reads, for callers that send or receive a layer in place (a transfer
  // starts at first_block when the receiver holds the blocks before it).
  // Pointers stay valid for the KvCache's lifetime; the bytes belong to
  // whoever holds the table. InvalidArgument for a bad layer, num_tokens
  // outside [0, Capacity(table)] or first_block outside [0, blocks].
  absl::StatusOr<std::vector<std::span<const uint8_t>>> LayerChunks(
      const BlockTable& table, int64_t layer, int64_t num_tokens,
      int64_t first_block = 0) const;
  absl::StatusOr<std::vector<std::span<uint8_t>>> MutableLayerChunks(
      const BlockTable& table, int64_t layer, int64_t num_tokens,
      int64_t first_block = 0);

  // --- Checks for tests and metrics (BlockAllocator::CheckInvariants) ---
  absl::Status CheckInvariants() const { return allocator_.CheckInvariants(); }
  absl::Status CheckInvariants(
      std::span<const BlockTable* const> live_tables) const {
    return allocator_.CheckInvariants(live_tables);
  }

 private:
  KvCache(const KvLayout& layout, int64_t num_blocks, uint64_t pool_bytes,
          std::unique_ptr<KvPoolMemory> memory);
  uint8_t* mutable_pool_data() { return const_cast<uint8_t*>(pool_data()); }

  void CheckOwner(const BlockTable& table) const {
    allocator_.CheckOwner(table);
  }
  // InvalidArgument unless layer is in range, 0 <= num_tokens <=
  // Capacity(table) and 0 <= first_block <= BlocksNeeded(num_tokens).
  absl::Status CheckChunkRequest(const BlockTable& table, int64_t layer,
                                 int64_t num_tokens, int64_t first_block) const;
  // Bytes of the K element (layer, block of position, head 0, slot, dim 0).
  uint64_t KeyOffset(const BlockTable& table, int64_t layer,
                     int64_t position) const;

  KvLayout layout_;
  int64_t num_blocks_;
  uint64_t chunk_bytes_;
  uint64_t layer_bytes_;  // num_blocks_ * chunk_bytes_
  uint64_t pool_bytes_;
  std::unique_ptr<KvPoolMemory> memory_;  // null without host storage
  BlockAllocator allocator_;
};

}  // namespace baton

#endif  // BATON_WORKER_KV_CACHE_KV_CACHE_H_
