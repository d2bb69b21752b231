// The host half of CudaModelRunner's CUDA-graph decode path: which steps
// qualify, the padded batch size (bucket) a step runs at, which decode
// attention bound (context tier) its graph was captured with, and the fixed
// int32 metadata layout a bucket's graph reads, filled per step.
//
// Buckets: n items run as a batch of DecodeGraphBucket(n, max_batch) rows:
// 1, 2, 4 (powers of two), then multiples of 8 up to 32 (8, 16, 24, 32),
// multiples of 16 up to 128 (48, 64, ...), multiples of 32 beyond; a round-up
// past max_batch is clamped to max_batch (so max_batch itself is a bucket).
// Fewer than half of a bucket's rows are padding (fewer than a third from
// bucket 24 on).
//
// Context tiers: a graph's decode attention is launched with
// max_context_len = the tier bound (256, 1024, 4096, then the model's
// context length; each capped at it), the smallest that covers every item's
// context, so its split grid (1, 4, 16, up to 32 splits) is fixed while a
// short batch does not pay for the longest context's empty splits.
//
// Padding rows (index s in [n, bucket)) are harmless by construction: token 0
// at position 0, token block -1 (WriteKvF16 skips the row: nothing is
// written to the pool), context length 0 (PagedAttentionDecode writes zeros
// and reads no K/V), an empty block-table row, an empty query range; their
// logits rows are computed and never copied to the host.
#ifndef BATON_WORKER_CUDA_DECODE_GRAPH_PLAN_H_
#define BATON_WORKER_CUDA_DECODE_GRAPH_PLAN_H_

#include <compare>
#include <cstdint>
#include <span>
#include <vector>

#include "worker/cuda/forward_plan.h"
#include "worker/engine/model_runner.h"

namespace baton {

// The tier bounds below the model's context length, smallest first.
inline constexpr int64_t kDecodeGraphContextTiers[] = {256, 1024, 4096};

// Identifies one captured graph.
struct DecodeGraphKey {
  int64_t bucket = 0;         // padded batch rows
  int64_t context_bound = 0;  // max_context_len of the decode attention
  friend bool operator==(const DecodeGraphKey&,
                         const DecodeGraphKey&) = default;
  friend auto operator<=>(const DecodeGraphKey&,
                          const DecodeGraphKey&) = default;
};

// The bucket for n items: the smallest bucket >= n as above, or 0 when n is
// outside [1, max_batch] (no graph).
int64_t DecodeGraphBucket(int64_t n, int64_t max_batch);

// Every bucket for max_batch, rising (empty when max_batch < 1).
std::vector<int64_t> DecodeGraphBuckets(int64_t max_batch);

// The tier bound covering max_context (the largest context of the step) for
// a model of context_length tokens: min(context_length, smallest tier >=
// max_context), or context_length when no tier below it covers max_context.
int64_t DecodeGraphContextBound(int64_t max_context, int64_t context_length);

// True when a step can run through a graph: at least one and at most
// max_batch items, each with exactly one token and LogitsMode::kLast, and no
// per-layer callback.
bool DecodeGraphEligible(std::span<const ForwardItem> items,
                         bool has_layer_callback, int64_t max_batch);

// The fixed layout of a bucket's metadata, in int32 elements from the start
// of the graph metadata buffer. Arrays as ForwardPlanOffsets with num_seqs =
// num_tokens = bucket and num_logit_rows = bucket; block_ids (last) has room
// for bucket * max_blocks_per_seq ids.
struct DecodeGraphLayout {
  int64_t bucket = 0;
  int64_t max_blocks_per_seq = 0;  // ceil(context_length / block_size)
  ForwardPlanOffsets offsets;
  int64_t total = 0;  // int32 elements of the whole layout
};

// REQUIRES: bucket >= 1, max_blocks_per_seq >= 1.
DecodeGraphLayout MakeDecodeGraphLayout(int64_t bucket,
                                        int64_t max_blocks_per_seq);

// What PackDecodeGraphStep wrote.
struct DecodeGraphPacked {
  // int32 elements from the start of the layout that hold the step (every
  // array but the unused tail of block_ids): the bytes to upload.
  int64_t used = 0;
  int32_t max_context_len = 0;  // largest start_pos + 1 of the real items
};

// Writes the step's metadata into out[0, layout.total) in layout's places:
// item s (s < n) is row s, as BuildForwardPlan lays it out (block-table rows
// packed in item order from block_ids[0]); rows n .. bucket - 1 are padding
// (see the file comment). REQUIRES: the items passed ValidateForwardItems
// with block_size and a context length whose block count is at most
// layout.max_blocks_per_seq, DecodeGraphEligible, n <= layout.bucket, and
// out.size() >= layout.total.
DecodeGraphPacked PackDecodeGraphStep(std::span<const ForwardItem> items,
                                      int64_t block_size,
                                      const DecodeGraphLayout& layout,
                                      std::span<int32_t> out);

}  // namespace baton

#endif  // BATON_WORKER_CUDA_DECODE_GRAPH_PLAN_H_
