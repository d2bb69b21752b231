#include "worker/cuda/decode_graph_plan.h"

#include <algorithm>

#include "common/check.h"

namespace baton {
namespace {

int64_t RoundUp(int64_t n, int64_t step) {
  return (n + step - 1) / step * step;
}

}  // namespace

int64_t DecodeGraphBucket(int64_t n, int64_t max_batch) {
  if (n < 1 || n > max_batch) return 0;
  int64_t bucket;
  if (n <= 4) {
    bucket = 1;
    while (bucket < n) bucket *= 2;
  } else if (n <= 32) {
    bucket = RoundUp(n, 8);
  } else if (n <= 128) {
    bucket = RoundUp(n, 16);
  } else {
    bucket = RoundUp(n, 32);
  }
  return std::min(bucket, max_batch);
}

std::vector<int64_t> DecodeGraphBuckets(int64_t max_batch) {
  std::vector<int64_t> buckets;
  for (int64_t n = 1; n <= max_batch; ++n) {
    const int64_t b = DecodeGraphBucket(n, max_batch);
    if (buckets.empty() || buckets.back() != b) buckets.push_back(b);
    n = b;  // the next bucket starts above this one
  }
  return buckets;
}

int64_t DecodeGraphContextBound(int64_t max_context, int64_t context_length) {
  for (int64_t tier : kDecodeGraphContextTiers) {
    if (tier >= context_length) break;
    if (max_context <= tier) return tier;
  }
  return context_length;
}

bool DecodeGraphEligible(std::span<const ForwardItem> items,
                         bool has_layer_callback, int64_t max_batch) {
  if (has_layer_callback || items.empty() ||
      static_cast<int64_t>(items.size()) > max_batch) {
    return false;
  }
  return std::all_of(items.begin(), items.end(), [](const ForwardItem& item) {
    return item.tokens.size() == 1 && item.logits == LogitsMode::kLast;
  });
}

DecodeGraphLayout MakeDecodeGraphLayout(int64_t bucket,
                                        int64_t max_blocks_per_seq) {
  BATON_CHECK_GE(bucket, 1);
  BATON_CHECK_GE(max_blocks_per_seq, 1);
  DecodeGraphLayout layout;
  layout.bucket = bucket;
  layout.max_blocks_per_seq = max_blocks_per_seq;
  ForwardPlanOffsets& o = layout.offsets;
  o.token_ids = 0;
  o.positions = o.token_ids + bucket;
  o.token_blocks = o.positions + bucket;
  o.cu_seqlens = o.token_blocks + bucket;
  o.start_pos = o.cu_seqlens + bucket + 1;
  o.context_lens = o.start_pos + bucket;
  o.row_offsets = o.context_lens + bucket;
  o.logit_rows = o.row_offsets + bucket + 1;
  o.block_ids = o.logit_rows + bucket;
  layout.total = o.block_ids + bucket * max_blocks_per_seq;
  return layout;
}

DecodeGraphPacked PackDecodeGraphStep(std::span<const ForwardItem> items,
                                      int64_t block_size,
                                      const DecodeGraphLayout& layout,
                                      std::span<int32_t> out) {
  const int64_t n = static_cast<int64_t>(items.size());
  const int64_t bucket = layout.bucket;
  BATON_CHECK_LE(n, bucket);
  BATON_CHECK_GE(static_cast<int64_t>(out.size()), layout.total);
  const ForwardPlanOffsets& o = layout.offsets;
  int32_t* p = out.data();
  DecodeGraphPacked packed;
  int64_t blocks = 0;
  for (int64_t s = 0; s < n; ++s) {
    const ForwardItem& item = items[s];
    const int64_t pos = item.start_pos;
    const int64_t nb = pos / block_size + 1;  // blocks covering [0, pos]
    BATON_CHECK_LE(nb, layout.max_blocks_per_seq);
    const std::span<const int32_t> ids = item.table->block_ids();
    p[o.token_ids + s] = item.tokens[0];
    p[o.positions + s] = static_cast<int32_t>(pos);
    p[o.token_blocks + s] = ids[pos / block_size];
    p[o.cu_seqlens + s] = static_cast<int32_t>(s);
    p[o.start_pos + s] = static_cast<int32_t>(pos);
    p[o.context_lens + s] = static_cast<int32_t>(pos + 1);
    p[o.row_offsets + s] = static_cast<int32_t>(blocks);
    p[o.logit_rows + s] = static_cast<int32_t>(s);
    std::copy(ids.begin(), ids.begin() + nb, p + o.block_ids + blocks);
    blocks += nb;
    packed.max_context_len =
        std::max(packed.max_context_len, static_cast<int32_t>(pos + 1));
  }
  for (int64_t s = n; s < bucket; ++s) {
    p[o.token_ids + s] = 0;
    p[o.positions + s] = 0;
    p[o.token_blocks + s] = -1;
    p[o.cu_seqlens + s] = static_cast<int32_t>(n);
    p[o.start_pos + s] = 0;
    p[o.context_lens + s] = 0;
    p[o.row_offsets + s] = static_cast<int32_t>(blocks);
    p[o.logit_rows + s] = static_cast<int32_t>(s);
  }
  p[o.cu_seqlens + bucket] = static_cast<int32_t>(n);
  p[o.row_offsets + bucket] = static_cast<int32_t>(blocks);
  packed.used = o.block_ids + blocks;
  return packed;
}

}  // namespace baton
