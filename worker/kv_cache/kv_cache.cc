#include "worker/kv_cache/kv_cache.h"

#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/float16.h"

namespace baton {
namespace {

constexpr int64_t kMaxNumBlocks = std::numeric_limits<int32_t>::max();

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

KvCacheOptions KvCacheOptionsFor(const KvLayout& layout, int64_t num_blocks) {
  KvCacheOptions o;
  o.num_layers = layout.num_layers;
  o.num_kv_heads = layout.num_kv_heads;
  o.head_dim = layout.head_dim;
  o.block_size = layout.block_size;
  o.dtype = layout.dtype;
  o.num_blocks = num_blocks;
  return o;
}

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
  std::unique_ptr<KvPoolMemory> memory;
  if (options.host_storage) {
    BATON_ASSIGN_OR_RETURN(
        memory, KvPoolMemory::Allocate(total_bytes, options.prefault));
  }
  return std::unique_ptr<KvCache>(
      new KvCache(layout, num_blocks, total_bytes, std::move(memory)));
}

KvCache::KvCache(const KvLayout& layout, int64_t num_blocks,
                 uint64_t pool_bytes, std::unique_ptr<KvPoolMemory> memory)
    : layout_(layout),
      num_blocks_(num_blocks),
      chunk_bytes_(layout.chunk_bytes()),
      layer_bytes_(layout.chunk_bytes() * static_cast<uint64_t>(num_blocks)),
      pool_bytes_(pool_bytes),
      memory_(std::move(memory)),
      allocator_(num_blocks, layout.block_size) {}

const uint8_t* KvCache::pool_data() const {
  BATON_CHECK(memory_ != nullptr)
      << "KV bytes of a cache without host storage (they live on a device)";
  return memory_->data();
}

uint8_t* KvCache::LayerBlock(int64_t layer, int32_t block) {
  return const_cast<uint8_t*>(std::as_const(*this).LayerBlock(layer, block));
}

const uint8_t* KvCache::LayerBlock(int64_t layer, int32_t block) const {
  BATON_CHECK(layer >= 0 && layer < layout_.num_layers) << "layer " << layer;
  BATON_CHECK(block >= 0 && block < num_blocks_) << "block " << block;
  return pool_data() + static_cast<uint64_t>(layer) * layer_bytes_ +
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
    uint8_t* key = mutable_pool_data() + KeyOffset(table, layer, first + i);
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
  const uint8_t* key = pool_data() + KeyOffset(table, layer, position);
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
                                        int64_t num_tokens,
                                        int64_t first_block) const {
  CheckOwner(table);
  BATON_RETURN_IF_ERROR(CheckLayer(layer, layout_.num_layers));
  if (num_tokens < 0 || num_tokens > Capacity(table)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV chunks of layer ", layer, ": num_tokens must be in [0, ",
        Capacity(table), "] (the reserved capacity), got ", num_tokens));
  }
  if (first_block < 0 || first_block > BlocksNeeded(num_tokens)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV chunks of layer ", layer, ": first_block must be in [0, ",
        BlocksNeeded(num_tokens), "], got ", first_block));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::span<const uint8_t>>> KvCache::LayerChunks(
    const BlockTable& table, int64_t layer, int64_t num_tokens,
    int64_t first_block) const {
  BATON_RETURN_IF_ERROR(
      CheckChunkRequest(table, layer, num_tokens, first_block));
  const int64_t blocks = BlocksNeeded(num_tokens);
  std::vector<std::span<const uint8_t>> out;
  out.reserve(static_cast<size_t>(blocks - first_block));
  for (int64_t i = first_block; i < blocks; ++i) {
    out.emplace_back(
        LayerBlock(layer, table.block_ids_[static_cast<size_t>(i)]),
        chunk_bytes_);
  }
  return out;
}

absl::StatusOr<std::vector<std::span<uint8_t>>> KvCache::MutableLayerChunks(
    const BlockTable& table, int64_t layer, int64_t num_tokens,
    int64_t first_block) {
  BATON_RETURN_IF_ERROR(
      CheckChunkRequest(table, layer, num_tokens, first_block));
  const int64_t blocks = BlocksNeeded(num_tokens);
  std::vector<std::span<uint8_t>> out;
  out.reserve(static_cast<size_t>(blocks - first_block));
  for (int64_t i = first_block; i < blocks; ++i) {
    out.emplace_back(
        LayerBlock(layer, table.block_ids_[static_cast<size_t>(i)]),
        chunk_bytes_);
  }
  return out;
}

}  // namespace baton
