// Causal grouped-query attention of a sequence's new tokens over its paged KV
// cache (prefill chunks and decode steps use this one kernel, so a token's
// output does not depend on how its prompt was chunked or batched).
#ifndef BATON_KERNELS_CPU_PAGED_ATTENTION_H_
#define BATON_KERNELS_CPU_PAGED_ATTENTION_H_

#include <cstdint>
#include <span>

#include "kernels/cpu/cpu_features.h"

namespace baton {

// One layer of one sequence's cache. Block i holds positions
// [i * block_size, (i + 1) * block_size); its K and V are each
// [num_kv_heads][block_size][head_dim] IEEE half values.
struct PagedKvView {
  std::span<const uint16_t* const> k_blocks;
  std::span<const uint16_t* const> v_blocks;
  int64_t block_size = 16;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
};

struct AttentionShape {
  int64_t num_heads = 0;  // query heads; a multiple of kv.num_kv_heads
  float scale = 1.0f;     // usually 1 / sqrt(head_dim)
  // Floats from one query's row to the next in q and out; 0: num_heads *
  // head_dim (dense). Lets a caller pass one KV head's slice of a wider
  // [tokens][all heads][head_dim] layout.
  int64_t query_stride = 0;
};

// The SIMD paths read each K and V row once for the heads of up to this
// many consecutive queries: callers that split a prefill chunk's queries
// across threads keep runs of this many together.
inline constexpr int64_t kAttentionQueryTile = 4;

// For query i (0 <= i < num_queries) at position start_pos + i:
//   out[i][h] = sum_j softmax_j(scale * q[i][h] . K[j][g]) V[j][g],
//   j in [0, start_pos + i], g = h / (num_heads / num_kv_heads).
// q, out: [num_queries][num_heads][head_dim] float, rows shape.query_stride
// apart when that is set. The cache must already
// hold positions up to start_pos + num_queries - 1. Each (query, head) output
// is computed by the same arithmetic in the same order whatever num_queries
// and start_pos split the work, so results are bit-identical across
// chunkings and batches (on one CpuIsa path). Thread-safe; callers split
// queries across threads.
void PagedAttention(const float* q, int64_t num_queries, int64_t start_pos,
                    const AttentionShape& shape, const PagedKvView& kv,
                    float* out, CpuIsa isa = BestCpuIsa());

}  // namespace baton

#endif  // BATON_KERNELS_CPU_PAGED_ATTENTION_H_
