// Causal grouped-query attention over a paged device KV cache, batched over
// sequences so that one launch serves a whole continuous batch: the device
// side of kernels/cpu/paged_attention.h (same math, same cache layout).
//
//   PagedAttentionPrefill: many query tokens per sequence (prompts, chunked
//     prefill); flash-attention tiles of query rows x keys in shared memory
//     with an online softmax in float32.
//   PagedAttentionDecode: one query token per sequence; a sequence whose
//     context is longer than kPagedDecodeMinKeysPerSplit keys is split along
//     the context (each split writes a partial max / sum / output to a
//     workspace, a second kernel combines them), a shorter one is finished by
//     the first kernel.
//
// Determinism: the reduction order for a (token, head) depends only on the
// token's position and its sequence's context, never on the batch it ran in
// or (for prefill) on how its prompt was chunked, so a token's output is
// bit-identical across batches and chunkings of the same entry point. Prefill
// and decode are different kernels: they agree within rounding, not bitwise.
#ifndef BATON_KERNELS_CUDA_PAGED_ATTENTION_H_
#define BATON_KERNELS_CUDA_PAGED_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace baton::cuda {

// Query heads per KV head (num_heads / num_kv_heads) at most this.
inline constexpr int64_t kPagedAttentionMaxGroup = 16;
// Decode: contexts of at most this many keys are not split; longer ones get
// ceil(context / kPagedDecodeMinKeysPerSplit) splits, at most
// kPagedDecodeMaxSplits.
// Short splits keep the GPU busy at small batches: a batch of one sequence
// of 512 keys on 8 KV heads is 64 CTAs, not 16.
inline constexpr int64_t kPagedDecodeMinKeysPerSplit = 64;
inline constexpr int64_t kPagedDecodeMaxSplits = 64;

// One layer of a device KV pool laid out as worker/kv_cache/kv_layout.h with
// dtype F16: chunk (layer l, block b) = K then V, each
// [num_kv_heads][block_size][head_dim] IEEE half (uint16 storage), at element
// ((l * num_blocks + b) * 2) * num_kv_heads * block_size * head_dim.
struct PagedKvPoolView {
  const uint16_t* pool = nullptr;  // device base of the whole pool, 16-aligned
  int64_t layer = 0;               // the layer attended over, >= 0
  int64_t num_blocks = 0;          // blocks per layer; ids in [0, num_blocks)
  int64_t num_kv_heads = 0;        // [1, 1024]
  int64_t head_dim = 0;            // 64 or 128
  int64_t block_size = 0;          // tokens per block, [1, 1024]
};

// The block tables of a batch, concatenated: sequence s's position t lives in
// block block_ids[row_offsets[s] + t / block_size], slot t % block_size.
struct DeviceBlockTables {
  const int32_t* block_ids = nullptr;    // device int32
  const int32_t* row_offsets = nullptr;  // device int32 [num_seqs + 1], rising
};

// A prefill batch. Sequence s has n_s = cu_seqlens_q[s + 1] - cu_seqlens_q[s]
// new tokens, rows cu_seqlens_q[s] .. cu_seqlens_q[s + 1] - 1 of q and out,
// at positions start_pos[s] .. start_pos[s] + n_s - 1; its cache must hold
// positions [0, start_pos[s] + n_s) (the new tokens' K and V included).
struct PagedPrefillBatch {
  int32_t num_seqs = 0;    // [0, 65535]
  int32_t num_tokens = 0;  // rows of q and out, >= cu_seqlens_q[num_seqs]
  int32_t max_queries_per_seq = 0;  // host bound >= every n_s; sizes the grid
  const int32_t* cu_seqlens_q =
      nullptr;                         // device int32 [num_seqs + 1], 0 first
  const int32_t* start_pos = nullptr;  // device int32 [num_seqs], >= 0
  DeviceBlockTables tables;
};

// A decode batch: one new token per sequence, at position
// context_lens[s] - 1; its cache holds positions [0, context_lens[s]). A
// sequence with context_lens[s] == 0 is padding (a fixed-size batch under a
// CUDA graph): its rows of out are zeros and no K/V is read for it.
//   max_context_len fixes the launch grid (PagedDecodeNumSplits of it along
// the context); results do not depend on it, so a fixed bound far above the
// batch's contexts gives the same bits, at the cost of CTAs that exit at
// once: (splits(bound) - splits(context)) per (KV head, sequence).
struct PagedDecodeBatch {
  int32_t num_seqs = 0;         // [0, 65535]
  int32_t max_context_len = 0;  // host bound >= every context_lens[s], >= 1
  const int32_t* context_lens = nullptr;  // device int32 [num_seqs], >= 0
  DeviceBlockTables tables;
};

// For every query row t and head h (g = h / (num_heads / num_kv_heads)):
//   out[t][h] = sum_j softmax_j(scale * q[t][h] . K[j][g]) V[j][g]
// over the keys j <= position of row t of its sequence.
//   q, out: device float32 [num_tokens][num_heads][head_dim], 16-aligned;
//           rows outside every sequence are not written.
// Malformed device metadata never leads to an access out of bounds: rows of
// a sequence whose cu_seqlens_q lie outside [0, num_tokens] are not written;
// rows of a sequence with n_s > max_queries_per_seq, a negative start_pos or
// a block-table row shorter than its context are written as NaN, and so are
// the rows whose key range meets a block id outside [0, num_blocks) (at
// least every row at or after that block's first position).
// cudaErrorInvalidValue without launching for: a head_dim other than 64 or
// 128, num_heads not a positive multiple of num_kv_heads or a group above
// kPagedAttentionMaxGroup, a count out of range, a null or misaligned
// pointer while num_seqs > 0. Asynchronous on `stream`.
cudaError_t PagedAttentionPrefill(const float* q,
                                  const PagedPrefillBatch& batch,
                                  const PagedKvPoolView& kv, int64_t num_heads,
                                  float scale, float* out, cudaStream_t stream);

// Splits a decode context of `context_len` keys gets (1: not split).
int64_t PagedDecodeNumSplits(int64_t context_len);

// Bytes of workspace PagedAttentionDecode needs for a batch of `num_seqs`
// sequences whose contexts are at most `max_context_len` keys; 0 when no
// sequence can be split. Allocate once for the largest batch and context.
size_t PagedDecodeWorkspaceBytes(int64_t num_seqs, int64_t num_heads,
                                 int64_t head_dim, int64_t max_context_len);

// out[s][h] = attention of q[s][h] (position context_lens[s] - 1) over keys
// [0, context_lens[s]) of sequence s.
//   q, out:    device float32 [num_seqs][num_heads][head_dim], 16-aligned
//   workspace: device, >= PagedDecodeWorkspaceBytes(num_seqs, num_heads,
//              head_dim, max_context_len) bytes, 16-aligned; may be null when
//              that is 0. Not read before written; contents are scratch.
// Malformed device metadata (a context outside [0, max_context_len], a short
// block-table row, a block id outside [0, num_blocks)) sets that sequence's
// rows of out to NaN and reads nothing out of bounds; context 0 gives zeros.
// cudaErrorInvalidValue without launching as PagedAttentionPrefill, and for a
// workspace smaller than needed. Asynchronous on `stream` (two launches when
// max_context_len > kPagedDecodeMinKeysPerSplit).
cudaError_t PagedAttentionDecode(const float* q, const PagedDecodeBatch& batch,
                                 const PagedKvPoolView& kv, int64_t num_heads,
                                 float scale, void* workspace,
                                 size_t workspace_bytes, float* out,
                                 cudaStream_t stream);

}  // namespace baton::cuda

#endif  // BATON_KERNELS_CUDA_PAGED_ATTENTION_H_
