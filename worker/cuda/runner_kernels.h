// Small device ops the CUDA forward pass needs beyond kernels/cuda/: writing
// a batch's new K/V rows into the paged fp16 pool, float32 -> bfloat16
// conversion of GEMM inputs, the Q/K/V bias add and the row gather before the
// LM head.
#ifndef BATON_WORKER_CUDA_RUNNER_KERNELS_H_
#define BATON_WORKER_CUDA_RUNNER_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace baton::cuda {

// A device KV pool laid out as worker/kv_cache/kv_layout.h with dtype F16:
// element (layer l, block b, K=0/V=1, head h, slot s, dim d) at index
//   ((l * num_blocks + b) * 2 + kv) * num_kv_heads * block_size * head_dim
//     + (h * block_size + s) * head_dim + d.
struct KvPoolShape {
  int64_t num_layers = 0;
  int64_t num_blocks = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 0;
};

// For every token t < tokens: the slot s = positions[t] % block_size of block
// token_blocks[t] in `layer` gets K = half(k[t]) and V = half(v[t]) for every
// head (round to nearest even, as KvCache::WriteKv).
//   k, v:         device float32 [tokens][num_kv_heads][head_dim]
//   positions:    device int32 [tokens]
//   token_blocks: device int32 [tokens]; a token whose block is outside
//                 [0, num_blocks) or whose position is negative is skipped
//                 (the caller validates on the host)
//   pool:         device, the whole pool (IEEE half bits)
// cudaErrorInvalidValue without launching for a shape with a count <= 0, a
// pool size that overflows int64, layer outside [0, num_layers), tokens < 0,
// or a null pointer with tokens > 0. Asynchronous on `stream`.
cudaError_t WriteKvF16(const float* k, const float* v, const int32_t* positions,
                       const int32_t* token_blocks, int64_t tokens,
                       const KvPoolShape& shape, int64_t layer, uint16_t* pool,
                       cudaStream_t stream);

// y[i] = bfloat16(x[i]) for i < n, round to nearest even (as
// baton::F32ToBF16 for every non-NaN input; NaN becomes a quiet NaN).
//   x: device float32 [n]; y: device bfloat16 bits [n]; no overlap.
// cudaErrorInvalidValue without launching if n < 0 or a pointer is null with
// n > 0. Asynchronous on `stream`.
cudaError_t F32ToBF16(const float* x, int64_t n, uint16_t* y,
                      cudaStream_t stream);

// x[r][c] += bias[c] (one float32 rounding, as the CPU runner's bias add).
//   x: device float32 [rows][cols]; bias: device float32 [cols].
// cudaErrorInvalidValue without launching if a count is negative, rows * cols
// overflows, or a pointer is null with rows * cols > 0. Asynchronous.
cudaError_t AddBias(float* x, const float* bias, int64_t rows, int64_t cols,
                    cudaStream_t stream);

// out[r][:] = x[rows[r]][:] for r < n_rows.
//   x:    device float32 [x_rows][dim]
//   rows: device int32 [n_rows]; an index outside [0, x_rows) gives a row of
//         NaN and reads nothing
//   out:  device float32 [n_rows][dim]; must not overlap x
// cudaErrorInvalidValue without launching if a count is negative, a product
// overflows, or a pointer is null with n_rows * dim > 0. Asynchronous.
cudaError_t GatherRows(const float* x, int64_t x_rows, const int32_t* rows,
                       int64_t n_rows, int64_t dim, float* out,
                       cudaStream_t stream);

}  // namespace baton::cuda

#endif  // BATON_WORKER_CUDA_RUNNER_KERNELS_H_
