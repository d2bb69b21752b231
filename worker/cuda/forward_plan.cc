#include "worker/cuda/forward_plan.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace baton {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

int64_t BlocksFor(int64_t tokens, int64_t block_size) {
  return (tokens + block_size - 1) / block_size;
}

}  // namespace

absl::Status ValidateForwardItems(std::span<const ForwardItem> items,
                                  const ForwardLimits& limits) {
  if (limits.vocab_size <= 0 || limits.context_length <= 0 ||
      limits.context_length > kInt32Max || limits.block_size <= 0 ||
      limits.num_blocks <= 0 || limits.num_blocks > kInt32Max ||
      limits.max_batch_tokens <= 0 || limits.max_batch_tokens > kInt32Max) {
    return absl::InvalidArgumentError(absl::StrCat(
        "forward limits out of range: vocab ", limits.vocab_size,
        ", context length ", limits.context_length, ", block size ",
        limits.block_size, ", blocks ", limits.num_blocks,
        ", max batch tokens ", limits.max_batch_tokens,
        " (each must be in [1, 2^31 - 1])"));
  }
  if (items.size() > static_cast<size_t>(kMaxForwardItems)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the batch has ", items.size(), " items, at most ",
                     kMaxForwardItems, " are supported"));
  }
  int64_t total = 0, total_blocks = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const ForwardItem& item = items[i];
    if (item.table == nullptr || item.tokens.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch item ", i, " has no table or no tokens"));
    }
    const int64_t n = static_cast<int64_t>(item.tokens.size());
    total += n;
    if (total > limits.max_batch_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("the batch has more than ", limits.max_batch_tokens,
                       " tokens (max_batch_tokens) at item ", i));
    }
    if (item.start_pos != item.table->num_tokens()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch item ", i, " starts at position ", item.start_pos,
          " but its cache holds ", item.table->num_tokens(), " tokens"));
    }
    const int64_t end = item.start_pos + n;
    if (end > limits.context_length) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch item ", i, " reaches position ", end,
                       ", beyond the context length ", limits.context_length));
    }
    const int64_t capacity = item.table->num_blocks() * limits.block_size;
    if (capacity < end) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch item ", i, " needs ", end,
                       " cached tokens, its table holds ", capacity));
    }
    for (int32_t token : item.tokens) {
      if (token < 0 || token >= limits.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("batch item ", i, ": token id ", token,
                         " is outside [0, ", limits.vocab_size, ")"));
      }
    }
    const int64_t needed = BlocksFor(end, limits.block_size);
    total_blocks += needed;
    if (total_blocks > kInt32Max) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the batch reaches more than 2^31 - 1 blocks at item ", i));
    }
    const std::span<const int32_t> ids =
        item.table->block_ids().first(static_cast<size_t>(needed));
    for (size_t b = 0; b < ids.size(); ++b) {
      if (ids[b] < 0 || ids[b] >= limits.num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat(
            "batch item ", i, ": block ", b, " of its table has id ", ids[b],
            ", outside the device pool's [0, ", limits.num_blocks, ")"));
      }
    }
  }
  return absl::OkStatus();
}

void BuildForwardPlan(std::span<const ForwardItem> items, int64_t block_size,
                      ForwardPlan* plan) {
  const int64_t seqs = static_cast<int64_t>(items.size());
  int64_t tokens = 0, blocks = 0, logit_rows = 0;
  int32_t max_queries = 0, max_context = 0;
  bool single = true;
  for (const ForwardItem& item : items) {
    const int64_t n = static_cast<int64_t>(item.tokens.size());
    const int64_t end = item.start_pos + n;
    tokens += n;
    blocks += BlocksFor(end, block_size);
    logit_rows += item.logits == LogitsMode::kAll    ? n
                  : item.logits == LogitsMode::kLast ? 1
                                                     : 0;
    max_queries = std::max(max_queries, static_cast<int32_t>(n));
    max_context = std::max(max_context, static_cast<int32_t>(end));
    single = single && n == 1;
  }
  plan->num_tokens = tokens;
  plan->num_seqs = seqs;
  plan->all_single_token = single && seqs > 0;
  plan->max_queries_per_seq = max_queries;
  plan->max_context_len = max_context;
  plan->num_logit_rows = logit_rows;

  ForwardPlanOffsets& o = plan->offsets;
  o.token_ids = 0;
  o.positions = o.token_ids + tokens;
  o.token_blocks = o.positions + tokens;
  o.cu_seqlens = o.token_blocks + tokens;
  o.start_pos = o.cu_seqlens + seqs + 1;
  o.context_lens = o.start_pos + seqs;
  o.row_offsets = o.context_lens + seqs;
  o.logit_rows = o.row_offsets + seqs + 1;
  o.block_ids = o.logit_rows + logit_rows;
  std::vector<int32_t>& p = plan->packed;
  p.assign(static_cast<size_t>(o.block_ids + blocks), 0);

  int64_t row = 0, block = 0, logit = 0;
  for (int64_t s = 0; s < seqs; ++s) {
    const ForwardItem& item = items[s];
    const int64_t n = static_cast<int64_t>(item.tokens.size());
    const int64_t end = item.start_pos + n;
    const std::span<const int32_t> ids = item.table->block_ids();
    p[o.cu_seqlens + s] = static_cast<int32_t>(row);
    p[o.start_pos + s] = static_cast<int32_t>(item.start_pos);
    p[o.context_lens + s] = static_cast<int32_t>(end);
    p[o.row_offsets + s] = static_cast<int32_t>(block);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t pos = item.start_pos + j;
      p[o.token_ids + row + j] = item.tokens[j];
      p[o.positions + row + j] = static_cast<int32_t>(pos);
      p[o.token_blocks + row + j] = ids[pos / block_size];
      if (item.logits == LogitsMode::kAll ||
          (item.logits == LogitsMode::kLast && j == n - 1)) {
        p[o.logit_rows + logit++] = static_cast<int32_t>(row + j);
      }
    }
    const int64_t nb = BlocksFor(end, block_size);
    for (int64_t b = 0; b < nb; ++b) p[o.block_ids + block + b] = ids[b];
    row += n;
    block += nb;
  }
  p[o.cu_seqlens + seqs] = static_cast<int32_t>(row);
  p[o.row_offsets + seqs] = static_cast<int32_t>(block);
}

}  // namespace baton
