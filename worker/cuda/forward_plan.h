// The host half of a CUDA forward step: checks a batch of ForwardItems as
// ModelRunner::Forward does (plus the device runner's own limits) and lays
// out the int32 metadata the device kernels read, packed so that one copy
// uploads it.
#ifndef BATON_WORKER_CUDA_FORWARD_PLAN_H_
#define BATON_WORKER_CUDA_FORWARD_PLAN_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "worker/engine/model_runner.h"

namespace baton {

// Items per batch at most (the attention kernels' grid limit).
inline constexpr int64_t kMaxForwardItems = 65535;

// What a batch must fit.
struct ForwardLimits {
  int64_t vocab_size = 0;        // token ids in [0, vocab_size)
  int64_t context_length = 0;    // positions below it
  int64_t block_size = 0;        // tokens per KV block
  int64_t num_blocks = 0;        // block ids in [0, num_blocks)
  int64_t max_batch_tokens = 0;  // tokens of all items together
};

// Offsets (in int32 elements) of each array inside ForwardPlan::packed.
struct ForwardPlanOffsets {
  int64_t token_ids = 0;     // [num_tokens]
  int64_t positions = 0;     // [num_tokens]
  int64_t token_blocks = 0;  // [num_tokens] block of each token's position
  int64_t cu_seqlens = 0;    // [num_seqs + 1] first row of each item
  int64_t start_pos = 0;     // [num_seqs]
  int64_t context_lens = 0;  // [num_seqs] start_pos + tokens
  int64_t row_offsets = 0;   // [num_seqs + 1] into block_ids
  int64_t logit_rows = 0;    // [num_logit_rows] rows that get logits
  int64_t block_ids = 0;     // [row_offsets[num_seqs]] per item, in order
};

struct ForwardPlan {
  int64_t num_tokens = 0;
  int64_t num_seqs = 0;
  // Every item has exactly one token (the decode attention kernel applies).
  bool all_single_token = false;
  int32_t max_queries_per_seq = 0;  // largest item
  int32_t max_context_len = 0;      // largest start_pos + tokens
  int64_t num_logit_rows = 0;
  ForwardPlanOffsets offsets;
  std::vector<int32_t> packed;
};

// InvalidArgument (naming the item), as ModelRunner::Forward, for a null
// table or no tokens, a token id outside the
// vocabulary, start_pos different from the table's token count, a position
// beyond the context length, a table whose blocks hold fewer than
// start_pos + tokens tokens; and, for the device runner, a block id outside
// [0, num_blocks) among the blocks the item reaches, more than
// max_batch_tokens tokens or kMaxForwardItems items in the batch, or a limit
// that int32 device metadata cannot hold.
absl::Status ValidateForwardItems(std::span<const ForwardItem> items,
                                  const ForwardLimits& limits);

// Fills *plan for items that passed ValidateForwardItems (reusing its
// vectors). Each item contributes its tokens in order (rows of the batch),
// the blocks covering positions [0, start_pos + tokens) and, per its
// LogitsMode, none, its last or all of its rows as logit rows.
void BuildForwardPlan(std::span<const ForwardItem> items, int64_t block_size,
                      ForwardPlan* plan);

}  // namespace baton

#endif  // BATON_WORKER_CUDA_FORWARD_PLAN_H_
