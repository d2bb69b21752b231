// PagedAttentionDecode: one query token per sequence, split along the context
// for long sequences (flash-decoding).
//
// DecodeKernel: one CTA (128 threads) per (KV head, sequence, split); it
// serves all query heads of the KV head's group so they share K/V reads. The
// split covers keys [split * per, min(ctx, (split + 1) * per)) with
// per = ceil(ctx / splits), walked in chunks of kChunk keys:
//   1. scores: a team of D / 8 lanes per key, 16 bytes of K per lane, dot
//      products reduced by shuffles -> s_s (exp2 domain);
//   2. online softmax per head (one warp per head): running max m, sum l,
//      rescale factor alpha, s_s <- exp2(s - m);
//   3. thread (key lane kl, dim quad dp) accumulates p * V[key][4 dp .. +3]
//      over keys kl, kl + kKeyLanes, ... (8-byte loads, a warp per V row of
//      128 dims); the key lanes are summed once at the end, in a fixed order.
// A sequence with one split writes out directly; otherwise each split writes
// (m, l, unnormalised o) and CombineKernel merges them. A sequence of context
// 0 (a padding row) is written as zeros by split 0 and reads no K/V.
// max_context_len only sets the grid's split dimension (CTAs beyond a
// sequence's own split count return at once) and the workspace stride, never
// a sequence's splits or ranges, so a batch may pass a bound far above its
// contexts (CUDA graphs pass a fixed one) for the cost of those empty CTAs.
// Splits, their ranges and every reduction order depend only on the sequence's
// own context, so a token's output does not depend on the batch it ran in.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/paged_attention_internal.h"

namespace baton::cuda {
namespace {

using paged_attention_internal::Aligned16;
using paged_attention_internal::DevicePool;
using paged_attention_internal::EightHalvesToFloats;
using paged_attention_internal::HalvesToFloats;
using paged_attention_internal::KeyOffset;
using paged_attention_internal::kLog2e;
using paged_attention_internal::kMaxSeqs;
using paged_attention_internal::MakeDevicePool;
using paged_attention_internal::PoolShapeOk;
using paged_attention_internal::QuietNaN;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 128;  // keys scored per pass
constexpr int kMaxGroup = static_cast<int>(kPagedAttentionMaxGroup);

__host__ __device__ inline int32_t NumSplits(int64_t context_len) {
  if (context_len <= kPagedDecodeMinKeysPerSplit) return 1;
  const int64_t n = (context_len + kPagedDecodeMinKeysPerSplit - 1) /
                    kPagedDecodeMinKeysPerSplit;
  return static_cast<int32_t>(
      n < kPagedDecodeMaxSplits ? n : kPagedDecodeMaxSplits);
}

struct DecodeParams {
  const float* q;
  float* out;
  const int32_t* context_lens;
  const int32_t* block_ids;
  const int32_t* row_offsets;
  DevicePool pool;
  // Partials, slot (row = seq * num_heads + head) * max_splits + split:
  // ws_o [slots][D], ws_m and ws_l [slots]. Null when max_splits == 1.
  float* ws_o;
  float* ws_m;
  float* ws_l;
  int32_t max_context_len;
  int32_t max_splits;
  int32_t num_heads;
  int32_t group;
  float scale_log2;  // scale * log2(e)
};

// The sequence's split count; 1 for a context outside [1, max_context_len]
// (which DecodeKernel then reports as NaN).
__device__ inline int32_t SeqSplits(const DecodeParams& p, int32_t ctx) {
  return ctx >= 1 && ctx <= p.max_context_len ? NumSplits(ctx) : 1;
}

// G: query heads per KV head the kernel has room for (>= the group), so
// the accumulators take registers for G heads, not G.
template <int D, int G>
__global__ void __launch_bounds__(kThreads) DecodeKernel(const DecodeParams p) {
  constexpr int kTpk = D / 8;                        // lanes per key (K)
  constexpr int kKeysPerStep = kThreads / kTpk;      // keys per K step
  constexpr int kDimThreads = D / 4;                 // lanes per V row
  constexpr int kKeyLanes = kThreads / kDimThreads;  // keys per V step
  static_assert(32 % kTpk == 0 && kThreads % kDimThreads == 0);
  __shared__ __align__(16) float q_s[G * D];  // pre-scaled
  __shared__ float s_s[G * kChunk];
  __shared__ int32_t ids_s[kChunk];       // block id of each key of the chunk
  __shared__ float red_s[kKeyLanes * D];  // one head at a time
  __shared__ float m_s[G];
  __shared__ float l_s[G];
  __shared__ float alpha_s[G];

  const int tid = threadIdx.x;
  const int kv_head = blockIdx.x;
  const int seq = blockIdx.y;
  const int split = blockIdx.z;
  const int group = p.group;
  const int32_t ctx = p.context_lens[seq];
  const int32_t splits = SeqSplits(p, ctx);
  if (split >= splits) return;
  const int64_t row0 =
      static_cast<int64_t>(seq) * p.num_heads +
      static_cast<int64_t>(kv_head) * group;          // first head of the group
  const int64_t slot0 = row0 * p.max_splits + split;  // partials of row0

  const int32_t table_begin = p.row_offsets[seq];
  const int32_t table_end = p.row_offsets[seq + 1];
  const bool bad_meta =
      ctx < 1 || ctx > p.max_context_len || table_begin < 0 ||
      table_end < table_begin ||
      static_cast<int64_t>(table_end - table_begin) * p.pool.block_size < ctx;
  if (bad_meta) {
    // A padding row (context 0) has splits == 1 and gets zeros.
    const float fill = ctx == 0 ? 0.f : QuietNaN();
    for (int idx = tid; idx < group * D; idx += kThreads) {
      const int h = idx / D;
      const int d = idx % D;
      if (splits == 1) {
        p.out[(row0 + h) * D + d] = fill;
      } else {
        const int64_t slot = slot0 + static_cast<int64_t>(h) * p.max_splits;
        p.ws_o[slot * D + d] = QuietNaN();
        if (d == 0) {
          p.ws_m[slot] = 0.f;
          p.ws_l[slot] = QuietNaN();
        }
      }
    }
    return;
  }
  const int64_t per = (static_cast<int64_t>(ctx) + splits - 1) / splits;
  const int64_t begin = split * per;
  const int64_t end = min(static_cast<int64_t>(ctx), begin + per);

  for (int idx = tid; idx < group * D; idx += kThreads) {
    q_s[idx] = p.q[row0 * D + idx] * p.scale_log2;
  }
  if (tid < group) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.f;
  }
  __syncthreads();

  const int team = tid / kTpk;  // key of a K step
  const int lane_t = tid % kTpk;
  const int dp = tid % kDimThreads;  // dims 4 dp .. 4 dp + 3 in the V step
  const int kl = tid / kDimThreads;
  const int warp = tid / 32;
  const int lane = tid % 32;
  float acc[G][4];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    acc[h][0] = acc[h][1] = acc[h][2] = acc[h][3] = 0.f;
  }
  int any_bad = 0;

  for (int64_t c0 = begin; c0 < end; c0 += kChunk) {
    const int n = static_cast<int>(min(static_cast<int64_t>(kChunk), end - c0));
    // The chunk's block ids, one lookup per key up front, so the K and V
    // loads below do not wait on a table load each.
    for (int kk = tid; kk < n; kk += kThreads) {
      ids_s[kk] = p.block_ids[table_begin + static_cast<int32_t>(c0 + kk) /
                                                p.pool.block_size];
    }
    __syncthreads();
    // 1. Scores. Every lane runs every step (the shuffles need the warp).
    int bad_block = 0;
#pragma unroll 4
    for (int base = 0; base < n; base += kKeysPerStep) {
      const int kk = base + team;
      const bool valid = kk < n;
      float kf[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      if (valid) {
        const int32_t key = static_cast<int32_t>(c0 + kk);
        const int32_t block = ids_s[kk];
        if (block < 0 || block >= p.pool.num_blocks) {
          bad_block = 1;
        } else {
          const uint16_t* src =
              p.pool.layer_base +
              KeyOffset(p.pool, block, kv_head, key % p.pool.block_size, D) +
              lane_t * 8;
          EightHalvesToFloats(*reinterpret_cast<const uint4*>(src), kf);
        }
      }
#pragma unroll
      for (int h = 0; h < G; ++h) {
        if (h >= group) break;  // uniform across the CTA
        const float4 qa =
            *reinterpret_cast<const float4*>(q_s + h * D + lane_t * 8);
        const float4 qb =
            *reinterpret_cast<const float4*>(q_s + h * D + lane_t * 8 + 4);
        float part = qa.x * kf[0];
        part = fmaf(qa.y, kf[1], part);
        part = fmaf(qa.z, kf[2], part);
        part = fmaf(qa.w, kf[3], part);
        part = fmaf(qb.x, kf[4], part);
        part = fmaf(qb.y, kf[5], part);
        part = fmaf(qb.z, kf[6], part);
        part = fmaf(qb.w, kf[7], part);
#pragma unroll
        for (int off = kTpk / 2; off > 0; off /= 2) {
          part += __shfl_xor_sync(0xffffffffu, part, off);
        }
        if (valid && lane_t == 0) s_s[h * kChunk + kk] = part;
      }
    }
    any_bad |= __syncthreads_or(bad_block);

    // 2. Online softmax, one warp per head.
    for (int h = warp; h < group; h += kWarps) {
      float* s = s_s + h * kChunk;
      float mx = -INFINITY;
      for (int kk = lane; kk < n; kk += 32) mx = fmaxf(mx, s[kk]);
#pragma unroll
      for (int off = 16; off > 0; off /= 2) {
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      }
      const float m_old = m_s[h];
      const float m_new = fmaxf(m_old, mx);  // finite: n >= 1 keys
      float sum = 0.f;
      for (int kk = lane; kk < n; kk += 32) {
        const float e = exp2f(s[kk] - m_new);
        s[kk] = e;
        sum += e;
      }
#pragma unroll
      for (int off = 16; off > 0; off /= 2) {
        sum += __shfl_xor_sync(0xffffffffu, sum, off);
      }
      __syncwarp();
      if (lane == 0) {
        const float alpha = exp2f(m_old - m_new);
        alpha_s[h] = alpha;
        l_s[h] = l_s[h] * alpha + sum;
        m_s[h] = m_new;
      }
    }
    __syncthreads();

    // 3. acc = alpha acc + P V: 8 bytes of V per lane, a warp per 128-dim
    // row, several keys' loads in flight.
#pragma unroll
    for (int h = 0; h < G; ++h) {
      if (h >= group) break;
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[h][j] *= alpha_s[h];
    }
#pragma unroll 4
    for (int kk = kl; kk < n; kk += kKeyLanes) {
      const int32_t key = static_cast<int32_t>(c0 + kk);
      const int32_t block = ids_s[kk];
      if (block < 0 || block >= p.pool.num_blocks) continue;  // flagged above
      const uint16_t* src =
          p.pool.layer_base + p.pool.half_chunk +
          KeyOffset(p.pool, block, kv_head, key % p.pool.block_size, D) +
          dp * 4;
      const uint2 raw = *reinterpret_cast<const uint2*>(src);
      const float2 v01 = HalvesToFloats(raw.x);
      const float2 v23 = HalvesToFloats(raw.y);
#pragma unroll
      for (int h = 0; h < G; ++h) {
        if (h >= group) break;
        const float pr = s_s[h * kChunk + kk];
        acc[h][0] = fmaf(pr, v01.x, acc[h][0]);
        acc[h][1] = fmaf(pr, v01.y, acc[h][1]);
        acc[h][2] = fmaf(pr, v23.x, acc[h][2]);
        acc[h][3] = fmaf(pr, v23.y, acc[h][3]);
      }
    }
    __syncthreads();  // the next chunk overwrites s_s and alpha_s
  }

  // The key lanes' partial sums, one head at a time, added in lane order.
#pragma unroll
  for (int h = 0; h < G; ++h) {
    if (h >= group) break;
#pragma unroll
    for (int j = 0; j < 4; ++j) red_s[kl * D + dp * 4 + j] = acc[h][j];
    __syncthreads();
    for (int d = tid; d < D; d += kThreads) {
      float o = red_s[d];
#pragma unroll
      for (int k = 1; k < kKeyLanes; ++k) o += red_s[k * D + d];
      if (splits == 1) {
        p.out[(row0 + h) * D + d] = any_bad ? QuietNaN() : o / l_s[h];
      } else {
        const int64_t slot = slot0 + static_cast<int64_t>(h) * p.max_splits;
        p.ws_o[slot * D + d] = any_bad ? QuietNaN() : o;
        if (d == 0) {
          p.ws_m[slot] = m_s[h];
          p.ws_l[slot] = any_bad ? QuietNaN() : l_s[h];
        }
      }
    }
    __syncthreads();  // the next head overwrites red_s
  }
}

// out[row] = sum_s w_s o_s / sum_s w_s l_s, w_s = exp2(m_s - max m), for
// every row of a sequence with more than one split. One CTA per (head, seq).
__global__ void __launch_bounds__(kThreads)
    CombineKernel(const DecodeParams p, int head_dim) {
  const int head = blockIdx.x;
  const int seq = blockIdx.y;
  const int32_t splits = SeqSplits(p, p.context_lens[seq]);
  if (splits <= 1) return;  // DecodeKernel wrote the row
  const int64_t row = static_cast<int64_t>(seq) * p.num_heads + head;
  const float* m = p.ws_m + row * p.max_splits;
  const float* l = p.ws_l + row * p.max_splits;
  const float* o = p.ws_o + row * p.max_splits * head_dim;
  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, m[s]);
  float total = 0.f;
  for (int s = 0; s < splits; ++s) total = fmaf(exp2f(m[s] - mx), l[s], total);
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float sum = 0.f;
    for (int s = 0; s < splits; ++s) {
      sum = fmaf(exp2f(m[s] - mx), o[static_cast<int64_t>(s) * head_dim + d],
                 sum);
    }
    p.out[row * head_dim + d] = sum / total;
  }
}

template <int D>
void LaunchDecodeD(int group, dim3 grid, const DecodeParams& params,
                   cudaStream_t stream) {
  if (group <= 4) {
    DecodeKernel<D, 4><<<grid, kThreads, 0, stream>>>(params);
  } else if (group <= 8) {
    DecodeKernel<D, 8><<<grid, kThreads, 0, stream>>>(params);
  } else {
    DecodeKernel<D, kMaxGroup><<<grid, kThreads, 0, stream>>>(params);
  }
}

void LaunchDecode(int64_t head_dim, int group, dim3 grid,
                  const DecodeParams& params, cudaStream_t stream) {
  if (head_dim == 64) {
    LaunchDecodeD<64>(group, grid, params, stream);
  } else {
    LaunchDecodeD<128>(group, grid, params, stream);
  }
}

}  // namespace

int64_t PagedDecodeNumSplits(int64_t context_len) {
  return NumSplits(context_len);
}

size_t PagedDecodeWorkspaceBytes(int64_t num_seqs, int64_t num_heads,
                                 int64_t head_dim, int64_t max_context_len) {
  if (num_seqs <= 0 || num_seqs > kMaxSeqs || num_heads <= 0 ||
      num_heads > kMaxGroup * 1024 || head_dim <= 0 || head_dim > 1024) {
    return 0;
  }
  const int64_t splits = NumSplits(max_context_len);
  if (splits == 1) return 0;
  return static_cast<size_t>(num_seqs * num_heads * splits * (head_dim + 2)) *
         sizeof(float);
}

cudaError_t PagedAttentionDecode(const float* q, const PagedDecodeBatch& batch,
                                 const PagedKvPoolView& kv, int64_t num_heads,
                                 float scale, void* workspace,
                                 size_t workspace_bytes, float* out,
                                 cudaStream_t stream) {
  if (batch.num_seqs < 0 || batch.num_seqs > kMaxSeqs ||
      batch.max_context_len < 0) {
    return cudaErrorInvalidValue;
  }
  if (!PoolShapeOk(kv, num_heads)) return cudaErrorInvalidValue;
  if (batch.num_seqs == 0) return cudaSuccess;
  if (batch.max_context_len < 1 || q == nullptr || out == nullptr ||
      !Aligned16(q) || !Aligned16(out) || batch.context_lens == nullptr ||
      batch.tables.block_ids == nullptr ||
      batch.tables.row_offsets == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int32_t max_splits = NumSplits(batch.max_context_len);
  const size_t needed = PagedDecodeWorkspaceBytes(
      batch.num_seqs, num_heads, kv.head_dim, batch.max_context_len);
  if (max_splits > 1 && (needed == 0 || workspace == nullptr ||
                         !Aligned16(workspace) || workspace_bytes < needed)) {
    return cudaErrorInvalidValue;
  }

  DecodeParams params;
  params.q = q;
  params.out = out;
  params.context_lens = batch.context_lens;
  params.block_ids = batch.tables.block_ids;
  params.row_offsets = batch.tables.row_offsets;
  params.pool = MakeDevicePool(kv);
  params.ws_o = nullptr;
  params.ws_m = nullptr;
  params.ws_l = nullptr;
  if (max_splits > 1) {
    const int64_t slots =
        static_cast<int64_t>(batch.num_seqs) * num_heads * max_splits;
    params.ws_o = static_cast<float*>(workspace);
    params.ws_m = params.ws_o + slots * kv.head_dim;
    params.ws_l = params.ws_m + slots;
  }
  params.max_context_len = batch.max_context_len;
  params.max_splits = max_splits;
  params.num_heads = static_cast<int32_t>(num_heads);
  params.group = static_cast<int32_t>(num_heads / kv.num_kv_heads);
  params.scale_log2 = scale * kLog2e;

  const dim3 grid(static_cast<unsigned>(kv.num_kv_heads),
                  static_cast<unsigned>(batch.num_seqs),
                  static_cast<unsigned>(max_splits));
  LaunchDecode(kv.head_dim, params.group, grid, params, stream);
  if (max_splits == 1) BATON_CUDA_RETURN_LAUNCH_ERROR();
  BATON_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  const dim3 combine_grid(static_cast<unsigned>(num_heads),
                          static_cast<unsigned>(batch.num_seqs));
  CombineKernel<<<combine_grid, kThreads, 0, stream>>>(
      params, static_cast<int>(kv.head_dim));
  BATON_CUDA_RETURN_LAUNCH_ERROR();
}

}  // namespace baton::cuda
