// Rotary position embeddings on the device, applied in place to a batch of
// tokens' queries and keys, each token at its own position.
#ifndef BATON_KERNELS_CUDA_ROPE_H_
#define BATON_KERNELS_CUDA_ROPE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cpu/rope.h"

namespace baton::cuda {

// A cos/sin table on the device and how to apply it. Non-owning.
struct RopeDeviceTable {
  const float* cos = nullptr;  // device, float32 [max_positions][rope_dim / 2]
  const float* sin = nullptr;  // device, float32 [max_positions][rope_dim / 2]
  int64_t head_dim = 0;        // elements per head
  int64_t rope_dim = 0;        // leading dims rotated (even, <= head_dim)
  bool interleaved = true;     // pairs (2i, 2i+1) if true, (i, i + d/2) if not
  int64_t max_positions = 0;   // rows of the table
};

// Elements of each of the cos and sin tables for `options`:
// max_positions * (rope_dim / 2); 0 if RopeTable::Create would reject the
// options (same checks).
int64_t RopeTableElements(const RopeOptions& options);

// Computes on the host the table baton::RopeTable::Create builds for
// `options` (RopeTable keeps its table private, so this repeats its
// arithmetic: the same double-precision angles, rounded once to float) and
// copies it to `cos` and `sin` (device, RopeTableElements(options) floats
// each). On success *table describes them. Synchronizes `stream` (a load-time
// call). cudaErrorInvalidValue if RopeTableElements(options) is 0 or a
// pointer is null.
cudaError_t UploadRopeTable(const RopeOptions& options, float* cos, float* sin,
                            RopeDeviceTable* table, cudaStream_t stream);

// For each token t < tokens, rotates every head of q[t] and k[t] by the angle
// of position positions[t], exactly as RopeTable::Apply (x0 * c - x1 * s and
// x0 * s + x1 * c, each product and sum rounded to float, no fused
// multiply-add), so results equal the CPU's bit for bit.
//   positions: device, int32 [tokens]; a position outside
//              [0, table.max_positions) turns that token's rotated elements
//              into NaN (the caller validates positions beforehand)
//   q: device, float32 [tokens][num_heads][head_dim], in place
//   k: device, float32 [tokens][num_kv_heads][head_dim], in place; may be
//      null when num_kv_heads == 0 (and q likewise with num_heads == 0)
// cudaErrorInvalidValue without launching for negative counts, a table whose
// shape is inconsistent (rope_dim odd, <= 0 or > head_dim, max_positions <=
// 0, null tables), null pointers with work to do, or sizes that overflow.
// Asynchronous on `stream`.
cudaError_t ApplyRope(const RopeDeviceTable& table, const int32_t* positions,
                      int64_t tokens, float* q, int64_t num_heads, float* k,
                      int64_t num_kv_heads, cudaStream_t stream);

}  // namespace baton::cuda

#endif  // BATON_KERNELS_CUDA_ROPE_H_
