#include "worker/kv_cache/kv_cache.h"

#include <atomic>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/float16.h"

namespace baton {
namespace {

constexpr int64_t kMaxNumBlocks = std::numeric_limits<int32_t>::max();

std::atomic<uint64_t> next_pool_id{1};

// dst: count elements of `dtype`.
void StoreRow(const float* src, int64_t count, DType dtype, uint8_t* dst) {
  if (dtype == DType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
    return;
  }
  uint16_t* out = reinterpret_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < count; ++i) out[i] = F32ToF16(src[i]);
}

void LoadRow(const uint8_t* src, int64_t count, DType dtype, float* dst) {
  if (dtype == DType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
    return;
  }
  const uint16_t* in = reinterpret_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < count; ++i) dst[i] = F16ToF32(in[i]);
}

absl::Status CheckLayer(int64_t layer, int64_t num_layers) {
  if (layer < 0 || layer >= num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV layer must be in [0, ", num_layers, "), got ", layer));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(
    const KvCacheOptions& options) {
  KvLayout layout{.num_layers = options.num_layers,
                  .num_kv_heads = options.num_kv_heads,
                  .head_dim = options.head_dim,
                  .block_size = options.block_size,
                  .dtype = options.dtype};
  BATON_RETURN_IF_ERROR(layout.Validate());
  const uint64_t chunk = layout.chunk_bytes();
  const uint64_t block_all_layers =
      chunk * static_cast<uint64_t>(layout.num_layers);

  int64_t num_blocks = options.num_blocks;
  if ((options.num_blocks != 0) == (options.max_bytes != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache: set exactly one of num_blocks and max_bytes, got "
        "num_blocks=",
        options.num_blocks, " and max_bytes=", options.max_bytes));
  }
  if (options.max_bytes != 0) {
    uint64_t derived = options.max_bytes / block_all_layers;
    if (derived == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV cache max_bytes=", options.max_bytes,
          " is below one block across all layers (", block_all_layers,
          " bytes for ", layout.ToString(), ")"));
    }
    if (derived > static_cast<uint64_t>(kMaxNumBlocks)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV cache max_bytes=", options.max_bytes, " gives ", derived,
          " blocks, more than the maximum ", kMaxNumBlocks));
    }
    num_blocks = static_cast<int64_t>(derived);
  } else if (num_blocks < 1 || num_blocks > kMaxNumBlocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache num_blocks must be in [1, ", kMaxNumBlocks,
                     "], got ", num_blocks));
  }

  uint64_t total_bytes = 0;
  if (__builtin_mul_overflow(block_all_layers,
                             static_cast<uint64_t>(num_blocks), &total_bytes)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV pool of ", num_blocks, " blocks x ", block_all_layers,
                     " bytes overflows 64 bits"));
  }
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<KvPoolMemory> memory,
                         KvPoolMemory::Allocate(total_bytes, options.prefault));
  return std::unique_ptr<KvCache>(
      new KvCache(layout, num_blocks, std::move(memory)));
}

KvCache::KvCache(const KvLayout& layout, int64_t num_blocks,
                 std::unique_ptr<KvPoolMemory> memory)
    : layout_(layout),
      num_blocks_(num_blocks),
      chunk_bytes_(layout.chunk_bytes()),
      layer_bytes_(layout.chunk_bytes() * static_cast<uint64_t>(num_blocks)),
      pool_id_(next_pool_id.fetch_add(1)),
      memory_(std::move(memory)),
      ref_counts_(static_cast<size_t>(num_blocks), 0),
      free_ring_(static_cast<size_t>(num_blocks)),
      free_head_(0),
      free_count_(num_blocks) {
  for (int64_t b = 0; b < num_blocks; ++b) {
    free_ring_[static_cast<size_t>(b)] = static_cast<int32_t>(b);
  }
}

int64_t KvCache::BlocksNeeded(int64_t num_tokens) const {
  BATON_CHECK_GE(num_tokens, 0);
  const int64_t bs = layout_.block_size;
  return num_tokens / bs + (num_tokens % bs != 0 ? 1 : 0);
}

bool KvCache::CanReserve(const BlockTable& table, int64_t total_tokens) const {
  CheckOwner(table);
  if (total_tokens < 0) return false;
  return BlocksNeeded(total_tokens) - table.num_blocks() <= free_count_;
}

absl::Status KvCache::Reserve(BlockTable& table, int64_t total_tokens) {
  CheckOwner(table);
  if (total_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV reserve: total_tokens must be >= 0, got ", total_tokens));
  }
  const int64_t needed = BlocksNeeded(total_tokens) - table.num_blocks();
  if (needed <= 0) return absl::OkStatus();
  if (needed > free_count_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV cache full: ", total_tokens, " tokens need ", needed,
        " more blocks (sequence holds ", table.num_blocks(), ", block_size ",
        layout_.block_size, "), ", free_count_, " of ", num_blocks_,
        " blocks free",
        BlocksNeeded(total_tokens) > num_blocks_ ? " (exceeds the whole pool)"
                                                 : ""));
  }
  table.block_ids_.reserve(static_cast<size_t>(table.num_blocks() + needed));
  for (int64_t i = 0; i < needed; ++i) {
    int32_t block = free_ring_[static_cast<size_t>(free_head_)];
    free_head_ = free_head_ + 1 == num_blocks_ ? 0 : free_head_ + 1;
    --free_count_;
    BATON_CHECK_EQ(ref_counts_[static_cast<size_t>(block)], 0);
    ref_counts_[static_cast<size_t>(block)] = 1;
    table.block_ids_.push_back(block);
  }
  table.pool_id_ = pool_id_;
  return absl::OkStatus();
}

absl::Status KvCache::SetNumTokens(BlockTable& table, int64_t num_tokens) {
  CheckOwner(table);
  if (num_tokens < 0 || num_tokens > Capacity(table)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV num_tokens must be in [0, ", Capacity(table),
                     "] (the reserved capacity), got ", num_tokens));
  }
  table.num_tokens_ = num_tokens;
  return absl::OkStatus();
}

void KvCache::Free(BlockTable& table) {
  CheckOwner(table);
  for (int32_t block : table.block_ids_) {
    int32_t& refs = ref_counts_[static_cast<size_t>(block)];
    BATON_CHECK_GT(refs, 0) << "block " << block << " freed more than held";
    if (--refs == 0) {
      BATON_CHECK_LT(free_count_, num_blocks_);
      free_ring_[static_cast<size_t>((free_head_ + free_count_) %
                                     num_blocks_)] = block;
      ++free_count_;
    }
  }
  table.block_ids_.clear();
  table.num_tokens_ = 0;
  table.pool_id_ = 0;
}

uint8_t* KvCache::LayerBlock(int64_t layer, int32_t block) {
  return const_cast<uint8_t*>(std::as_const(*this).LayerBlock(layer, block));
}

const uint8_t* KvCache::LayerBlock(int64_t layer, int32_t block) const {
  BATON_CHECK(layer >= 0 && layer < layout_.num_layers) << "layer " << layer;
  BATON_CHECK(block >= 0 && block < num_blocks_) << "block " << block;
  return memory_->data() + static_cast<uint64_t>(layer) * layer_bytes_ +
         static_cast<uint64_t>(block) * chunk_bytes_;
}

KvLayerView KvCache::LayerView(int64_t layer) const {
  return KvLayerView{.base = LayerBlock(layer, 0),
                     .dtype = layout_.dtype,
                     .block_size = layout_.block_size,
                     .head_dim = layout_.head_dim,
                     .chunk_bytes = chunk_bytes_,
                     .head_bytes = layout_.head_bytes(),
                     .value_offset = layout_.half_chunk_bytes()};
}

uint64_t KvCache::KeyOffset(const BlockTable& table, int64_t layer,
                            int64_t position) const {
  CheckOwner(table);
  BATON_CHECK(layer >= 0 && layer < layout_.num_layers) << "layer " << layer;
  BATON_CHECK(position >= 0 && position < Capacity(table))
      << "position " << position << " outside the reserved " << Capacity(table)
      << " tokens";
  const int64_t bs = layout_.block_size;
  const int32_t block = table.block_ids_[static_cast<size_t>(position / bs)];
  return static_cast<uint64_t>(layer) * layer_bytes_ +
         static_cast<uint64_t>(block) * chunk_bytes_ +
         static_cast<uint64_t>((position % bs) * layout_.head_dim) *
             layout_.element_bytes();
}

void KvCache::WriteKv(const BlockTable& table, int64_t layer, int64_t position,
                      const float* k, const float* v) {
  WriteKvRange(table, layer, position, 1, k, v);
}

void KvCache::WriteKvRange(const BlockTable& table, int64_t layer,
                           int64_t first, int64_t count, const float* k,
                           const float* v) {
  const int64_t head_dim = layout_.head_dim;
  const int64_t kv_dim = layout_.kv_dim();
  const uint64_t head_bytes = layout_.head_bytes();
  const uint64_t v_offset = layout_.half_chunk_bytes();
  for (int64_t i = 0; i < count; ++i) {
    uint8_t* key = memory_->data() + KeyOffset(table, layer, first + i);
    const float* k_row = k + i * kv_dim;
    const float* v_row = v + i * kv_dim;
    for (int64_t h = 0; h < layout_.num_kv_heads; ++h) {
      uint8_t* dst = key + static_cast<uint64_t>(h) * head_bytes;
      StoreRow(k_row + h * head_dim, head_dim, layout_.dtype, dst);
      StoreRow(v_row + h * head_dim, head_dim, layout_.dtype, dst + v_offset);
    }
  }
}

void KvCache::ReadKv(const BlockTable& table, int64_t layer, int64_t position,
                     float* k, float* v) const {
  const int64_t head_dim = layout_.head_dim;
  const uint64_t head_bytes = layout_.head_bytes();
  const uint64_t v_offset = layout_.half_chunk_bytes();
  const uint8_t* key = memory_->data() + KeyOffset(table, layer, position);
  for (int64_t h = 0; h < layout_.num_kv_heads; ++h) {
    const uint8_t* src = key + static_cast<uint64_t>(h) * head_bytes;
    LoadRow(src, head_dim, layout_.dtype, k + h * head_dim);
    LoadRow(src + v_offset, head_dim, layout_.dtype, v + h * head_dim);
  }
}

uint64_t KvCache::LayerBytesForTokens(int64_t num_tokens) const {
  return static_cast<uint64_t>(BlocksNeeded(num_tokens)) * chunk_bytes_;
}

uint64_t KvCache::LayerBytes(const BlockTable& table) const {
  return LayerBytesForTokens(table.num_tokens());
}

absl::Status KvCache::ExportLayer(const BlockTable& table, int64_t layer,
                                  std::span<uint8_t> out) const {
  CheckOwner(table);
  BATON_RETURN_IF_ERROR(CheckLayer(layer, layout_.num_layers));
  const uint64_t expected = LayerBytes(table);
  if (out.size() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV export of layer ", layer, ": buffer must be ",
                     expected, " bytes (", BlocksNeeded(table.num_tokens()),
                     " blocks x ", chunk_bytes_, "), got ", out.size()));
  }
  const int64_t blocks = BlocksNeeded(table.num_tokens());
  for (int64_t i = 0; i < blocks; ++i) {
    std::memcpy(out.data() + static_cast<uint64_t>(i) * chunk_bytes_,
                LayerBlock(layer, table.block_ids_[static_cast<size_t>(i)]),
                chunk_bytes_);
  }
  return absl::OkStatus();
}

absl::Status KvCache::ImportLayer(const BlockTable& table, int64_t layer,
                                  int64_t num_tokens,
                                  std::span<const uint8_t> in) {
  CheckOwner(table);
  BATON_RETURN_IF_ERROR(CheckLayer(layer, layout_.num_layers));
  if (num_tokens < 0 || num_tokens > Capacity(table)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV import of layer ", layer, ": num_tokens must be in [0, ",
        Capacity(table), "] (the reserved capacity), got ", num_tokens));
  }
  const uint64_t expected = LayerBytesForTokens(num_tokens);
  if (in.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV import of layer ", layer, ": ", num_tokens, " tokens need ",
        expected, " bytes (", BlocksNeeded(num_tokens), " blocks x ",
        chunk_bytes_, "), got ", in.size()));
  }
  const int64_t blocks = BlocksNeeded(num_tokens);
  for (int64_t i = 0; i < blocks; ++i) {
    std::memcpy(LayerBlock(layer, table.block_ids_[static_cast<size_t>(i)]),
                in.data() + static_cast<uint64_t>(i) * chunk_bytes_,
                chunk_bytes_);
  }
  return absl::OkStatus();
}

absl::Status KvCache::CheckChunkRequest(const BlockTable& table, int64_t layer,
                                        int64_t num_tokens) const {
  CheckOwner(table);
  BATON_RETURN_IF_ERROR(CheckLayer(layer, layout_.num_layers));
  if (num_tokens < 0 || num_tokens > Capacity(table)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV chunks of layer ", layer, ": num_tokens must be in [0, ",
        Capacity(table), "] (the reserved capacity), got ", num_tokens));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::span<const uint8_t>>> KvCache::LayerChunks(
    const BlockTable& table, int64_t layer, int64_t num_tokens) const {
  BATON_RETURN_IF_ERROR(CheckChunkRequest(table, layer, num_tokens));
  const int64_t blocks = BlocksNeeded(num_tokens);
  std::vector<std::span<const uint8_t>> out;
  out.reserve(static_cast<size_t>(blocks));
  for (int64_t i = 0; i < blocks; ++i) {
    out.emplace_back(
        LayerBlock(layer, table.block_ids_[static_cast<size_t>(i)]),
        chunk_bytes_);
  }
  return out;
}

absl::StatusOr<std::vector<std::span<uint8_t>>> KvCache::MutableLayerChunks(
    const BlockTable& table, int64_t layer, int64_t num_tokens) {
  BATON_RETURN_IF_ERROR(CheckChunkRequest(table, layer, num_tokens));
  const int64_t blocks = BlocksNeeded(num_tokens);
  std::vector<std::span<uint8_t>> out;
  out.reserve(static_cast<size_t>(blocks));
  for (int64_t i = 0; i < blocks; ++i) {
    out.emplace_back(
        LayerBlock(layer, table.block_ids_[static_cast<size_t>(i)]),
        chunk_bytes_);
  }
  return out;
}

absl::Status KvCache::CheckInvariants() const {
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
  int64_t used = 0;
  for (int64_t b = 0; b < num_blocks_; ++b) {
    const int32_t refs = ref_counts_[static_cast<size_t>(b)];
    const bool free = on_free_list[static_cast<size_t>(b)];
    if (refs < 0 || (refs == 0) != free) {
      return absl::InternalError(
          absl::StrCat("KV block ", b, " has reference count ", refs,
                       " but is ", free ? "" : "not ", "on the free list"));
    }
    if (refs > 0) ++used;
  }
  if (used + free_count_ != num_blocks_ ||
      num_blocks_free() + num_blocks_used() != num_blocks_total()) {
    return absl::InternalError(
        absl::StrCat("KV accounting: ", used, " used + ", free_count_,
                     " free != ", num_blocks_, " total"));
  }
  return absl::OkStatus();
}

absl::Status KvCache::CheckInvariants(
    std::span<const BlockTable* const> live_tables) const {
  BATON_RETURN_IF_ERROR(CheckInvariants());
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
