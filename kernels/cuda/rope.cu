#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/rope.h"

namespace baton::cuda {
namespace {

constexpr int kThreads = 256;
// Work beyond kThreads * kMaxBlocks pairs is handled by a grid-stride loop.
constexpr int64_t kMaxBlocks = 1 << 16;

// One thread per (token, head, pair); heads [0, num_heads) are q's, the rest
// k's.
__global__ void RopeKernel(const float* __restrict__ cos_table,
                           const float* __restrict__ sin_table,
                           int64_t head_dim, int64_t pairs, bool interleaved,
                           int64_t max_positions,
                           const int32_t* __restrict__ positions,
                           int64_t tokens, float* q, int64_t num_heads,
                           float* k, int64_t num_kv_heads) {
  const int64_t heads = num_heads + num_kv_heads;
  const int64_t total = tokens * heads * pairs;
  for (int64_t idx =
           static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       idx < total; idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx % pairs;
    const int64_t head = (idx / pairs) % heads;
    const int64_t t = idx / (pairs * heads);
    float* x = head < num_heads
                   ? q + (t * num_heads + head) * head_dim
                   : k + (t * num_kv_heads + (head - num_heads)) * head_dim;
    const int64_t a = interleaved ? 2 * i : i;
    const int64_t b = interleaved ? 2 * i + 1 : i + pairs;
    const int64_t p = positions[t];
    if (p < 0 || p >= max_positions) {
      x[a] = __int_as_float(0x7fc00000);  // quiet NaN
      x[b] = __int_as_float(0x7fc00000);
      continue;
    }
    const float c = cos_table[p * pairs + i];
    const float s = sin_table[p * pairs + i];
    const float x0 = x[a];
    const float x1 = x[b];
    x[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    x[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
  }
}

bool ShapeOk(int64_t head_dim, int64_t rope_dim, int64_t max_positions) {
  return rope_dim > 0 && rope_dim % 2 == 0 && rope_dim <= head_dim &&
         max_positions > 0 && max_positions <= INT64_MAX / rope_dim;
}

}  // namespace

int64_t RopeTableElements(const RopeOptions& options) {
  // The checks of RopeTable::Create, without building its table.
  if (!ShapeOk(options.head_dim, options.rope_dim, options.max_positions) ||
      !(options.theta > 0) || !(options.linear_factor > 0)) {
    return 0;
  }
  const int64_t pairs = options.rope_dim / 2;
  if (!options.freq_factors.empty() &&
      static_cast<int64_t>(options.freq_factors.size()) != pairs) {
    return 0;
  }
  return options.max_positions * pairs;
}

cudaError_t UploadRopeTable(const RopeOptions& options, float* cos, float* sin,
                            RopeDeviceTable* table, cudaStream_t stream) {
  const int64_t elements = RopeTableElements(options);
  if (elements == 0 || cos == nullptr || sin == nullptr || table == nullptr) {
    return cudaErrorInvalidValue;
  }
  // The arithmetic of RopeTable::Create, operation for operation.
  const int64_t pairs = options.rope_dim / 2;
  std::vector<double> inv_freq(pairs);
  for (int64_t i = 0; i < pairs; ++i) {
    inv_freq[i] = std::pow(options.theta, -2.0 * i / options.rope_dim);
    if (!options.freq_factors.empty()) inv_freq[i] /= options.freq_factors[i];
  }
  std::vector<float> host_cos(elements);
  std::vector<float> host_sin(elements);
  for (int64_t p = 0; p < options.max_positions; ++p) {
    double pos = p / options.linear_factor;
    for (int64_t i = 0; i < pairs; ++i) {
      double angle = pos * inv_freq[i];
      host_cos[p * pairs + i] = static_cast<float>(std::cos(angle));
      host_sin[p * pairs + i] = static_cast<float>(std::sin(angle));
    }
  }
  const size_t bytes = static_cast<size_t>(elements) * sizeof(float);
  BATON_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(cos, host_cos.data(), bytes,
                                             cudaMemcpyHostToDevice, stream));
  BATON_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sin, host_sin.data(), bytes,
                                             cudaMemcpyHostToDevice, stream));
  // The host vectors die on return.
  BATON_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  table->cos = cos;
  table->sin = sin;
  table->head_dim = options.head_dim;
  table->rope_dim = options.rope_dim;
  table->interleaved = options.interleaved;
  table->max_positions = options.max_positions;
  return cudaSuccess;
}

cudaError_t ApplyRope(const RopeDeviceTable& table, const int32_t* positions,
                      int64_t tokens, float* q, int64_t num_heads, float* k,
                      int64_t num_kv_heads, cudaStream_t stream) {
  if (!ShapeOk(table.head_dim, table.rope_dim, table.max_positions) ||
      table.cos == nullptr || table.sin == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (tokens < 0 || num_heads < 0 || num_kv_heads < 0) {
    return cudaErrorInvalidValue;
  }
  // tokens * (num_heads + num_kv_heads) * head_dim must fit in int64.
  const int64_t heads_limit = INT64_MAX / 2 / table.head_dim;
  if (num_heads > heads_limit || num_kv_heads > heads_limit) {
    return cudaErrorInvalidValue;
  }
  const int64_t heads = num_heads + num_kv_heads;
  if (tokens == 0 || heads == 0) return cudaSuccess;
  if (tokens > INT64_MAX / (heads * table.head_dim)) {
    return cudaErrorInvalidValue;
  }
  if (positions == nullptr || (num_heads > 0 && q == nullptr) ||
      (num_kv_heads > 0 && k == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const int64_t pairs = table.rope_dim / 2;
  const int64_t total = tokens * heads * pairs;
  const int64_t needed = (total + kThreads - 1) / kThreads;
  const unsigned blocks =
      static_cast<unsigned>(needed < kMaxBlocks ? needed : kMaxBlocks);
  RopeKernel<<<blocks, kThreads, 0, stream>>>(
      table.cos, table.sin, table.head_dim, pairs, table.interleaved,
      table.max_positions, positions, tokens, q, num_heads, k, num_kv_heads);
  BATON_CUDA_RETURN_LAUNCH_ERROR();
}

}  // namespace baton::cuda
