// The shape of a paged KV cache pool, as far as the bytes of one sequence's
// layer depend on it. A prefill worker sends its KvLayout ahead of a transfer;
// the decode worker rejects the transfer unless it equals its own.
//
// Memory layout of a pool (layer-major, then block, then K/V, then head):
//
//   pool  = region[num_layers]
//   region(layer l)        = chunk[num_blocks]              (num_blocks x
//   chunk_bytes) chunk(layer l, block b) = K, V (chunk_bytes, contiguous) K
//   (and V)              = [num_kv_heads][block_size][head_dim] elements of
//   dtype
//
// so byte offset of element (l, b, kv in {K=0,V=1}, h, t, d) is
//   ((l * num_blocks + b) * 2 + kv) * half_chunk_bytes
//     + ((h * block_size + t) * head_dim + d) * element_bytes.
// One layer of one block is contiguous, so a layer can be shipped as soon as
// it is computed; one head's keys for a block are contiguous
// ([block_size][head_dim]) for the attention kernel.
#ifndef BATON_WORKER_KV_CACHE_KV_LAYOUT_H_
#define BATON_WORKER_KV_CACHE_KV_LAYOUT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "model/tensor.h"

namespace baton {

// Validation limits, inclusive.
inline constexpr int64_t kKvMaxNumLayers = 1024;
inline constexpr int64_t kKvMaxNumKvHeads = 1024;
inline constexpr int64_t kKvMaxHeadDim = 1024;
inline constexpr int64_t kKvMaxBlockSize = 1024;

struct KvLayout {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 0;     // tokens per block
  DType dtype = DType::kF16;  // kF16 or kF32

  // Elements of K (or V) per token per layer.
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  // 2 for kF16, 4 for kF32.
  uint64_t element_bytes() const { return dtype == DType::kF32 ? 4 : 2; }
  // Bytes of one head's keys (or values) in one block: [block_size][head_dim].
  uint64_t head_bytes() const {
    return static_cast<uint64_t>(block_size * head_dim) * element_bytes();
  }
  // Bytes of the K (or the V) half of a chunk.
  uint64_t half_chunk_bytes() const {
    return static_cast<uint64_t>(num_kv_heads) * head_bytes();
  }
  // Bytes of one (layer, block) chunk: K then V.
  uint64_t chunk_bytes() const { return 2 * half_chunk_bytes(); }

  // InvalidArgument naming the first field out of range (each count in
  // [1, kKvMax...], dtype F16 or F32). Use on a layout received from a peer.
  absl::Status Validate() const;

  // "KvLayout{layers=30, kv_heads=3, head_dim=64, block_size=16, dtype=F16,
  // chunk_bytes=12288}".
  std::string ToString() const;

  bool operator==(const KvLayout&) const = default;
};

// OK if `received == expected`; otherwise InvalidArgument naming every field
// that differs ("head_dim 128 vs expected 64") and both layouts.
absl::Status CheckLayoutMatches(const KvLayout& expected,
                                const KvLayout& received);

}  // namespace baton

#endif  // BATON_WORKER_KV_CACHE_KV_LAYOUT_H_
