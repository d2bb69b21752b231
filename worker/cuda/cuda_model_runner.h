// The Llama forward pass on one CUDA device: weights (bfloat16 matrices) and
// the paged fp16 KV pool in GPU memory, with the batch semantics of
// ModelRunner (worker/engine/model_runner.h).
//
// Per layer: RMSNorm -> Q/K/V GEMMs (bf16 in, fp32 accumulate) (+bias) ->
// RoPE -> K/V written into the pool -> paged attention (the decode kernel
// when every item has one token, else the prefill kernel) -> O GEMM ->
// residual + RMSNorm (fused) -> gate/up GEMMs -> SwiGLU -> down GEMM ->
// residual. Then the final norm and the LM head for the rows that want
// logits, which are copied to the host.
//
// Block ids: the items' BlockTables come from a host KvCache (the allocator);
// the device pool has the same layout and block count, so block b of the
// allocator is chunk (layer, b) of the device pool for every layer. Only the
// allocator's bookkeeping is used; its host memory is never touched.
//
// Numerics differ from the CPU runner (bf16 weights and GEMM inputs, other
// reduction orders), so logits agree within bf16 rounding, not bitwise. Row
// results may depend in the last bits on the batch (cuBLAS picks kernels by
// M).
//
// CUDA graphs are not used: every step launches its kernels one by one.
//
// Thread safety: none; one thread calls Forward at a time.
#ifndef BATON_WORKER_CUDA_CUDA_MODEL_RUNNER_H_
#define BATON_WORKER_CUDA_CUDA_MODEL_RUNNER_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kv_blocks.h"
#include "kernels/cuda/rope.h"
#include "worker/cuda/device_memory.h"
#include "worker/cuda/device_weights.h"
#include "worker/cuda/forward_plan.h"
#include "worker/engine/model_runner.h"
#include "worker/kv_cache/kv_cache.h"
#include "worker/kv_cache/kv_layout.h"

namespace baton {

struct CudaRunnerOptions {
  // --- Behaviour ---
  // CUDA device index; every call of the runner selects it first.
  int device = 0;
  // The host KvCache whose BlockTables the items carry. When set, Create
  // checks that its layout and block count equal the runner's, and Forward
  // commits each item's tokens through it (SetNumTokens) exactly as
  // ModelRunner::Forward does. When null, Forward leaves the tables as they
  // are and the caller commits start_pos + tokens after a successful call.
  KvCache* allocator = nullptr;

  // --- Performance ---
  // Tokens of all items of one Forward call together, at most; sizes the
  // activation buffers (about tokens * (6 * hidden + 3 * ffn) * 4 bytes).
  int64_t max_batch_tokens = 2048;
  // Logit rows per LM-head GEMM (the device logits buffer holds this many
  // rows of vocab floats; more rows are computed in several passes).
  int64_t max_logits_rows = 256;
};

class CudaModelRunner {
 public:
  // Selects options.device, uploads every weight, allocates the KV pool
  // (layout.num_layers * num_blocks * layout.chunk_bytes() bytes, cudaMalloc,
  // zero-filled) and the activation buffers. The runner borrows `weights`
  // (only during Create) and options.allocator (for its lifetime).
  // InvalidArgument (before touching a device) for a layout that does not fit
  // the model or is not F16, num_blocks outside [1, 2^31 - 1], option limits
  // out of range, or a model the kernels do not support (head_dim other than
  // 64/128, more than 16 query heads per KV head); FailedPrecondition naming
  // the CUDA error when the device is missing or unusable; ResourceExhausted
  // naming what and how many bytes when device memory runs out;
  // Unimplemented for YaRN rope scaling.
  static absl::StatusOr<std::unique_ptr<CudaModelRunner>> Create(
      const ModelWeights* weights, const KvLayout& layout, int64_t num_blocks,
      const CudaRunnerOptions& options);

  CudaModelRunner(const CudaModelRunner&) = delete;
  CudaModelRunner& operator=(const CudaModelRunner&) = delete;
  // Waits for the stream, then frees every device resource.
  ~CudaModelRunner();

  // ModelRunner::Forward's contract: runs the items as one batch; on success
  // each item's table holds start_pos + tokens.size() tokens (committed
  // through options.allocator when set) and `logits` holds, item by item,
  // one row of vocab_size floats per requested position. Returns after the
  // logits are on the host and the pool holds every new K/V.
  // InvalidArgument (naming the item) as ModelRunner::Forward, and for more
  // than max_batch_tokens tokens, a block id outside [0, num_blocks) or a
  // null `logits`; nothing is written then. `on_layer_done(l)` is called
  // once layer l's K/V of every item is in the device pool (the stream has
  // reached that point), while the device works on the rest of the step.
  // A CUDA or cuBLAS failure during the step returns Internal (or the
  // GEMM's code) naming the op and the error, and marks the runner
  // unhealthy: later calls fail with FailedPrecondition.
  absl::Status Forward(std::span<const ForwardItem> items,
                       std::vector<float>* logits,
                       const LayerDoneFn& on_layer_done = nullptr);

  // False once a step failed on the device; the worker should then report
  // itself unhealthy. unhealthy_reason() is the first failure.
  bool healthy() const { return unhealthy_reason_.ok(); }
  const absl::Status& unhealthy_reason() const { return unhealthy_reason_; }

  const ModelConfig& config() const { return config_; }
  int device() const { return device_; }
  // The stream every step runs on; transports reading the pool order
  // themselves after it (e.g. with an event recorded on it).
  cudaStream_t stream() const { return stream_; }
  const DeviceWeights& device_weights() const { return *weights_; }

  // --- The device KV pool (for the KV transports) ---
  // Chunk (layer, block) is chunk_bytes() bytes at
  // pool() + (layer * num_blocks() + block) * chunk_bytes(): K then V, each
  // [num_kv_heads][block_size][head_dim] IEEE half.
  void* pool() const { return pool_.get(); }
  uint64_t pool_bytes() const { return pool_.bytes(); }
  const KvLayout& layout() const { return layout_; }
  int64_t num_blocks() const { return num_blocks_; }
  uint64_t chunk_bytes() const { return layout_.chunk_bytes(); }
  cuda::KvPoolGeometry pool_geometry() const {
    return {layout_.num_layers, num_blocks_, layout_.chunk_bytes()};
  }

 private:
  CudaModelRunner(const ModelConfig& config, const KvLayout& layout,
                  int64_t num_blocks, const CudaRunnerOptions& options)
      : config_(config),
        layout_(layout),
        num_blocks_(num_blocks),
        options_(options),
        device_(options.device) {}
  absl::Status Init(const ModelWeights& weights, const RopeOptions& rope);
  absl::Status AllocateActivations();
  // Records `status` as the reason the runner is unhealthy and returns it.
  absl::Status Fail(absl::Status status);
  // The step after validation; any error it returns marks the runner
  // unhealthy.
  absl::Status Step(std::span<const ForwardItem> items,
                    std::vector<float>* logits,
                    const LayerDoneFn& on_layer_done);
  absl::Status Layer(int64_t l);
  absl::Status Attention(int64_t l);
  absl::Status LmHead(std::vector<float>* logits);
  // Device int32 metadata at `offset` of plan_.packed.
  const int32_t* Meta(int64_t offset) const {
    return meta_.as<int32_t>() + offset;
  }

  const ModelConfig config_;
  const KvLayout layout_;
  const int64_t num_blocks_;
  const CudaRunnerOptions options_;
  const int device_;
  absl::Status unhealthy_reason_;

  cudaStream_t stream_ = nullptr;
  cudaEvent_t kv_written_ = nullptr;  // after a layer's K/V write
  std::unique_ptr<DeviceWeights> weights_;
  std::unique_ptr<cuda::CudaGemm> gemm_;
  DeviceAllocation pool_;
  DeviceAllocation rope_cos_, rope_sin_;
  cuda::RopeDeviceTable rope_;
  float attention_scale_ = 0;

  // Activations, [max_batch_tokens][width] (logits_: [max_logits_rows]).
  DeviceAllocation x_;                 // residual stream, f32 [hidden]
  DeviceAllocation h_;                 // normed input, f32 [hidden]
  DeviceAllocation delta_;             // GEMM output added to x_, f32 [hidden]
  DeviceAllocation gemm_in_;           // bf16 [max(hidden, q_dim, ffn)]
  DeviceAllocation q_, k_, v_, attn_;  // f32 [q_dim], [kv_dim] x2, [q_dim]
  DeviceAllocation gate_, up_;         // f32 [ffn]
  DeviceAllocation logits_;            // f32 [vocab]
  DeviceAllocation meta_;              // int32, plan_.packed
  DeviceAllocation decode_workspace_;  // PagedAttentionDecode's

  ForwardPlan plan_;
};

}  // namespace baton

#endif  // BATON_WORKER_CUDA_CUDA_MODEL_RUNNER_H_
