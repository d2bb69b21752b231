// PagedAttentionPrefill: flash-attention over a paged KV cache, float32
// arithmetic on half K/V.
//
// One CTA (128 threads) takes a tile of kBr query rows of one (sequence, KV
// head); a row is a (token, query head of the group) pair, row r = token
// r / group, head g * group + r % group, so the group's heads share every K/V
// tile they load. It walks key tiles of kBc keys, aligned to absolute
// positions 0, kBc, 2 kBc, ..., up to the tile's last row's position; per
// tile: K and V -> shared (float), S = Q K^T (causally masked), online
// softmax, O += P V. Thread (ty, tx) = (tid / 8, tid % 8) owns rows ty * 4
// .. ty * 4 + 3, key columns tx + 8 c of S and head dims tx + 8 c of O, so a
// row's arithmetic (order included) does not depend on which tile or CTA it
// fell in: results are bit-identical across chunkings and batches.
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
using paged_attention_internal::KeyOffset;
using paged_attention_internal::kLog2e;
using paged_attention_internal::kMaxSeqs;
using paged_attention_internal::MakeDevicePool;
using paged_attention_internal::PoolShapeOk;
using paged_attention_internal::QuietNaN;

constexpr int kThreads = 128;
constexpr int kBr = 64;  // query rows per CTA
constexpr int kBc = 32;  // keys per tile
constexpr int kTx = 8;   // threads along a row (keys of S, dims of O)
constexpr int kRowsPerThread = kBr / (kThreads / kTx);  // 4
constexpr int kColsPerThread = kBc / kTx;               // 4
static_assert(kRowsPerThread == 4 && kColsPerThread == 4);
static_assert(32 % kTx == 0, "a row's threads must share a warp");
static_assert((kBr + kBc) % 4 == 0, "V in shared memory must be 16-aligned");

struct PrefillParams {
  const float* q;
  float* out;
  const int32_t* cu_seqlens_q;
  const int32_t* start_pos;
  const int32_t* block_ids;
  const int32_t* row_offsets;
  DevicePool pool;
  int32_t num_tokens;
  int32_t max_queries;
  int32_t num_heads;
  int32_t group;
  float scale_log2;  // scale * log2(e)
};

// Shared memory, floats: Q [kBr][D + 1], K [kBc][D + 1], V [kBc][D],
// P [kBr][kBc + 1]. The +1 pads make the column walks conflict-free.
template <int D>
constexpr size_t PrefillSmemBytes() {
  return sizeof(float) *
         (kBr * (D + 1) + kBc * (D + 1) + kBc * D + kBr * (kBc + 1));
}

// Element offset of row `row` of a sequence (its first token at q_begin) in
// q and out.
__device__ inline int64_t RowOffset(const PrefillParams& p, int32_t q_begin,
                                    int32_t kv_head, int64_t row, int D) {
  const int64_t token = q_begin + row / p.group;
  const int64_t head = static_cast<int64_t>(kv_head) * p.group + row % p.group;
  return (token * p.num_heads + head) * D;
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    PrefillKernel(const PrefillParams p) {
  extern __shared__ float smem[];
  float* qs = smem;
  float* ks = qs + kBr * (D + 1);
  float* vs = ks + kBc * (D + 1);
  float* ps = vs + kBc * D;

  const int tid = threadIdx.x;
  const int tx = tid % kTx;
  const int ty = tid / kTx;
  const int seq = blockIdx.z;
  const int kv_head = blockIdx.y;
  // Later tiles attend over more keys: start them first.
  const int64_t r0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kBr;

  const int32_t q_begin = p.cu_seqlens_q[seq];
  const int32_t q_end = p.cu_seqlens_q[seq + 1];
  if (q_begin < 0 || q_end < q_begin || q_end > p.num_tokens) return;
  const int32_t n_q = q_end - q_begin;
  const int64_t rows = static_cast<int64_t>(n_q) * p.group;
  if (r0 >= rows) return;
  const int64_t rows_here = min(static_cast<int64_t>(kBr), rows - r0);

  const int32_t start = p.start_pos[seq];
  const int32_t table_begin = p.row_offsets[seq];
  const int32_t table_end = p.row_offsets[seq + 1];
  const int64_t ctx = static_cast<int64_t>(start) + n_q;
  const bool bad_meta =
      n_q > p.max_queries || start < 0 || ctx > INT32_MAX || table_begin < 0 ||
      table_end < table_begin ||
      static_cast<int64_t>(table_end - table_begin) * p.pool.block_size < ctx;
  if (bad_meta) {
    for (int idx = tid; idx < rows_here * D; idx += kThreads) {
      p.out[RowOffset(p, q_begin, kv_head, r0 + idx / D, D) + idx % D] =
          QuietNaN();
    }
    return;
  }

  // Q tile, pre-scaled so that scores come out in the exp2 domain; rows past
  // the sequence are zeros.
  for (int idx = tid; idx < kBr * (D / 4); idx += kThreads) {
    const int r = idx / (D / 4);
    const int c = (idx % (D / 4)) * 4;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r < rows_here) {
      v = *reinterpret_cast<const float4*>(
          p.q + RowOffset(p, q_begin, kv_head, r0 + r, D) + c);
    }
    float* dst = qs + r * (D + 1) + c;
    dst[0] = v.x * p.scale_log2;
    dst[1] = v.y * p.scale_log2;
    dst[2] = v.z * p.scale_log2;
    dst[3] = v.w * p.scale_log2;
  }

  // Position of each of this thread's rows; -1 masks every key of a row past
  // the sequence (never written).
  int32_t qpos[kRowsPerThread];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int r = ty * kRowsPerThread + i;
    qpos[i] =
        r < rows_here ? static_cast<int32_t>(start + (r0 + r) / p.group) : -1;
  }
  const int32_t last_pos =
      static_cast<int32_t>(start + (r0 + rows_here - 1) / p.group);
  const int32_t num_tiles = last_pos / kBc + 1;

  float m[kRowsPerThread];  // running max (exp2 domain)
  float l[kRowsPerThread];  // running sum of exp2(s - m)
  float o[kRowsPerThread][D / kTx];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int c = 0; c < D / kTx; ++c) o[i][c] = 0.f;
  }
  int any_bad = 0;

  for (int32_t tile = 0; tile < num_tiles; ++tile) {
    const int32_t key0 = tile * kBc;
    // K, V tile (16 bytes per access); keys past the context are zeros.
    int bad_block = 0;
    for (int idx = tid; idx < kBc * (D / 8); idx += kThreads) {
      const int j = idx / (D / 8);
      const int c = (idx % (D / 8)) * 8;
      const int32_t key = key0 + j;
      uint4 kraw = make_uint4(0u, 0u, 0u, 0u);
      uint4 vraw = kraw;
      if (key < ctx) {
        const int32_t block =
            p.block_ids[table_begin + key / p.pool.block_size];
        if (block < 0 || block >= p.pool.num_blocks) {
          bad_block = 1;
        } else {
          const uint16_t* src =
              p.pool.layer_base +
              KeyOffset(p.pool, block, kv_head, key % p.pool.block_size, D) + c;
          kraw = *reinterpret_cast<const uint4*>(src);
          vraw = *reinterpret_cast<const uint4*>(src + p.pool.half_chunk);
        }
      }
      float kf[8];
      float vf[8];
      EightHalvesToFloats(kraw, kf);
      EightHalvesToFloats(vraw, vf);
#pragma unroll
      for (int e = 0; e < 8; ++e) ks[j * (D + 1) + c + e] = kf[e];
      *reinterpret_cast<float4*>(vs + j * D + c) =
          make_float4(vf[0], vf[1], vf[2], vf[3]);
      *reinterpret_cast<float4*>(vs + j * D + c + 4) =
          make_float4(vf[4], vf[5], vf[6], vf[7]);
    }
    any_bad |= __syncthreads_or(bad_block);

    // S = Q K^T for rows ty * 4 + i, keys tx + 8 c.
    float s[kRowsPerThread][kColsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
#pragma unroll
      for (int c = 0; c < kColsPerThread; ++c) s[i][c] = 0.f;
    }
#pragma unroll 8
    for (int d = 0; d < D; ++d) {
      float a[kRowsPerThread];
      float b[kColsPerThread];
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        a[i] = qs[(ty * kRowsPerThread + i) * (D + 1) + d];
      }
#pragma unroll
      for (int c = 0; c < kColsPerThread; ++c) {
        b[c] = ks[(tx + kTx * c) * (D + 1) + d];
      }
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
#pragma unroll
        for (int c = 0; c < kColsPerThread; ++c) {
          s[i][c] = fmaf(a[i], b[c], s[i][c]);
        }
      }
    }

    // Online softmax per row; a row's kTx threads are adjacent lanes.
    float alpha[kRowsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int c = 0; c < kColsPerThread; ++c) {
        if (key0 + tx + kTx * c > qpos[i]) s[i][c] = -INFINITY;
        tile_max = fmaxf(tile_max, s[i][c]);
      }
#pragma unroll
      for (int off = kTx / 2; off > 0; off /= 2) {
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
      }
      const float m_new = fmaxf(m[i], tile_max);
      // A row with no key yet (only rows past the sequence) keeps zeros.
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      alpha[i] = exp2f(m[i] - m_use);
      float sum = 0.f;
#pragma unroll
      for (int c = 0; c < kColsPerThread; ++c) {
        s[i][c] = exp2f(s[i][c] - m_use);
        sum += s[i][c];
        ps[(ty * kRowsPerThread + i) * (kBc + 1) + tx + kTx * c] = s[i][c];
      }
#pragma unroll
      for (int off = kTx / 2; off > 0; off /= 2) {
        sum += __shfl_xor_sync(0xffffffffu, sum, off);
      }
      l[i] = l[i] * alpha[i] + sum;
      m[i] = m_new;
    }
    __syncthreads();

    // O = alpha O + P V for rows ty * 4 + i, dims tx + 8 c.
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
#pragma unroll
      for (int c = 0; c < D / kTx; ++c) o[i][c] *= alpha[i];
    }
#pragma unroll 4
    for (int j = 0; j < kBc; ++j) {
      float pr[kRowsPerThread];
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        pr[i] = ps[(ty * kRowsPerThread + i) * (kBc + 1) + j];
      }
#pragma unroll
      for (int c = 0; c < D / kTx; ++c) {
        const float v = vs[j * D + tx + kTx * c];
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) {
          o[i][c] = fmaf(pr[i], v, o[i][c]);
        }
      }
    }
    __syncthreads();  // the next tile overwrites ks, vs, ps
  }

#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int r = ty * kRowsPerThread + i;
    if (r >= rows_here) continue;
    float* dst = p.out + RowOffset(p, q_begin, kv_head, r0 + r, D);
    // l >= 1: the row's maximum contributes exp2(0).
    const float inv = any_bad ? QuietNaN() : 1.f / l[i];
#pragma unroll
    for (int c = 0; c < D / kTx; ++c) dst[tx + kTx * c] = o[i][c] * inv;
  }
}

template <int D>
cudaError_t LaunchPrefill(const PrefillParams& params, dim3 grid,
                          cudaStream_t stream) {
  constexpr size_t kSmem = PrefillSmemBytes<D>();
  BATON_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      PrefillKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
      static_cast<int>(kSmem)));
  PrefillKernel<D><<<grid, kThreads, kSmem, stream>>>(params);
  BATON_CUDA_RETURN_LAUNCH_ERROR();
}

}  // namespace

cudaError_t PagedAttentionPrefill(const float* q,
                                  const PagedPrefillBatch& batch,
                                  const PagedKvPoolView& kv, int64_t num_heads,
                                  float scale, float* out,
                                  cudaStream_t stream) {
  if (batch.num_seqs < 0 || batch.num_seqs > kMaxSeqs || batch.num_tokens < 0 ||
      batch.max_queries_per_seq < 0) {
    return cudaErrorInvalidValue;
  }
  if (!PoolShapeOk(kv, num_heads)) return cudaErrorInvalidValue;
  if (batch.num_seqs == 0) return cudaSuccess;
  if (q == nullptr || out == nullptr || !Aligned16(q) || !Aligned16(out) ||
      batch.cu_seqlens_q == nullptr || batch.start_pos == nullptr ||
      batch.tables.block_ids == nullptr ||
      batch.tables.row_offsets == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (num_heads > INT32_MAX / 2 ||
      static_cast<int64_t>(batch.num_tokens) * num_heads >
          INT64_MAX / 4 / kv.head_dim) {
    return cudaErrorInvalidValue;
  }
  const int64_t group = num_heads / kv.num_kv_heads;
  const int64_t tiles =
      (static_cast<int64_t>(batch.max_queries_per_seq) * group + kBr - 1) / kBr;
  if (tiles > INT32_MAX) return cudaErrorInvalidValue;
  if (tiles == 0) return cudaSuccess;

  PrefillParams params;
  params.q = q;
  params.out = out;
  params.cu_seqlens_q = batch.cu_seqlens_q;
  params.start_pos = batch.start_pos;
  params.block_ids = batch.tables.block_ids;
  params.row_offsets = batch.tables.row_offsets;
  params.pool = MakeDevicePool(kv);
  params.num_tokens = batch.num_tokens;
  params.max_queries = batch.max_queries_per_seq;
  params.num_heads = static_cast<int32_t>(num_heads);
  params.group = static_cast<int32_t>(group);
  params.scale_log2 = scale * kLog2e;
  const dim3 grid(static_cast<unsigned>(tiles),
                  static_cast<unsigned>(kv.num_kv_heads),
                  static_cast<unsigned>(batch.num_seqs));
  return kv.head_dim == 64 ? LaunchPrefill<64>(params, grid, stream)
                           : LaunchPrefill<128>(params, grid, stream);
}

}  // namespace baton::cuda
