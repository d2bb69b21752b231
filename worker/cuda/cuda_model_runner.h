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
// CUDA graphs (decode steps): a step whose n items each have one token and
// LogitsMode::kLast, with no on_layer_done and n <= max_graph_batch(), runs
// as one cudaGraphLaunch of the graph of its DecodeGraphKey
// (worker/cuda/decode_graph_plan.h: n padded up to a bucket, the decode
// attention bounded by a context tier). A key's first step runs the same
// padded batch kernel by kernel (warming up cuBLAS for that M and module
// loading) and then captures it (cudaStreamCaptureModeThreadLocal on
// stream(), instantiated once, kept until the runner is destroyed). The
// step's int32 metadata is packed on the host into a pinned staging buffer
// in the bucket's fixed layout and uploaded by one cudaMemcpyAsync into a
// device buffer at a fixed address before the launch; every activation,
// weight, workspace and the pool stay at their addresses for the runner's
// lifetime, so a graph replays with new tokens, positions and block tables.
// The graph ends with the LM head into the device logits buffer; the n real
// rows are copied to the host after the launch. Padding rows write no K/V
// and read none (see decode_graph_plan.h), so they never touch the pool or
// the real rows. Every other step runs eagerly (kernel by kernel), as do all
// steps when options.cuda_graphs is false.
//   Real rows of a graph step equal the eager step of the same items bit for
// bit when n is a bucket size (same kernels, same grids; the decode
// attention's result does not depend on max_context_len). With padding, the
// GEMMs run with M = bucket instead of n and cuBLAS may pick another kernel,
// so rows may differ in the last bits, as they already do between batch
// sizes.
//   A capture or instantiation failure makes that key run eagerly for good
// (graph_failures() says why); a failure of a graph launch or of the work
// around it fails the step and marks the runner unhealthy like any step.
//
// Thread safety: none; one thread calls Forward at a time.
#ifndef BATON_WORKER_CUDA_CUDA_MODEL_RUNNER_H_
#define BATON_WORKER_CUDA_CUDA_MODEL_RUNNER_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kv_blocks.h"
#include "kernels/cuda/rope.h"
#include "worker/cuda/decode_graph_cache.h"
#include "worker/cuda/decode_graph_plan.h"
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
  // Runs qualifying decode steps through CUDA graphs (see the file comment);
  // false runs every step eagerly and allocates nothing for graphs.
  bool cuda_graphs = true;
  // Largest decode batch run through a graph, in [1, 4096]; the runner uses
  // min(max_graph_batch, max_batch_tokens, max_logits_rows). Larger decode
  // batches run eagerly. The graph metadata takes about
  // max_graph_batch * (8 + ceil(context_length / block_size)) * 4 bytes of
  // device and pinned host memory each, the graph decode workspace
  // max_graph_batch * num_heads * 32 * (head_dim + 2) * 4 bytes.
  int64_t max_graph_batch = 64;
  // Host staging pool of a CudaEngineRunner for the KV that host
  // transports (TCP) carry: at most this many bytes (whole blocks of every
  // layer, no more than the device pool), page-locked so the copies are
  // DMA. A transfer that does not fit stages in pageable memory of its own
  // (kv_staging.h). 0: no pool.
  uint64_t host_staging_bytes = uint64_t{1} << 30;
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
  // unhealthy: later calls fail with FailedPrecondition. Running out of
  // device memory for the step's buffers returns ResourceExhausted and
  // leaves the runner healthy.
  absl::Status Forward(std::span<const ForwardItem> items,
                       std::vector<float>* logits,
                       const LayerDoneFn& on_layer_done = nullptr);

  // --- The CUDA-graph decode path (see the file comment) ---
  // Steps run by cudaGraphLaunch, and steps run eagerly (kernel by kernel;
  // a key's first, pre-capture step counts here), since Create; rejected
  // and failed steps count in neither.
  int64_t graph_launches() const { return graph_launches_; }
  int64_t eager_steps() const { return eager_steps_; }
  // The largest decode batch that runs through a graph; 0 when
  // options.cuda_graphs is false.
  int64_t max_graph_batch() const { return graph_max_batch_; }
  // Keys with a captured graph, and keys whose capture failed (with the
  // reason); both in key order.
  std::vector<DecodeGraphKey> captured_graphs() const;
  std::vector<std::pair<DecodeGraphKey, absl::Status>> graph_failures() const;
  // Turns the graph path off (false) or back on for later steps; captured
  // graphs are kept. No effect when options.cuda_graphs was false.
  void set_cuda_graphs(bool enabled) { graphs_enabled_ = enabled; }

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
  // What the enqueued ops of one step read: the batch's shape and where its
  // int32 metadata lives on the device (plan_ in meta_ for an eager step, a
  // bucket's fixed layout in graph_meta_ for a graph).
  struct StepView {
    int64_t num_tokens = 0;  // rows of every activation
    int64_t num_seqs = 0;
    bool all_single_token = false;    // the decode attention kernel applies
    int32_t max_queries_per_seq = 0;  // prefill attention bound
    int32_t max_context_len = 0;      // decode attention bound
    int64_t num_logit_rows = 0;
    const int32_t* meta = nullptr;  // device base of `offsets`
    ForwardPlanOffsets offsets;
    void* decode_workspace = nullptr;
    size_t decode_workspace_bytes = 0;
    bool record_kv_event = true;  // kv_written_ after each layer's K/V write
    const int32_t* Meta(int64_t offset) const { return meta + offset; }
  };

  absl::Status Init(const ModelWeights& weights, const RopeOptions& rope);
  absl::Status AllocateActivations();
  // The graph metadata buffers and workspace (when graph_max_batch_ > 0).
  absl::Status AllocateGraphResources();
  // Records `status` as the reason the runner is unhealthy and returns it.
  absl::Status Fail(absl::Status status);
  // The step after validation; any error it returns marks the runner
  // unhealthy. Runs the graph path when the step qualifies, else eagerly.
  absl::Status Step(std::span<const ForwardItem> items,
                    std::vector<float>* logits,
                    const LayerDoneFn& on_layer_done);
  absl::Status EagerStep(std::span<const ForwardItem> items,
                         std::vector<float>* logits,
                         const LayerDoneFn& on_layer_done);
  // The graph path of a qualifying step (decode_graph_step.cc). *ran is
  // false (and nothing was enqueued) when the step's key cannot use a graph;
  // the caller then runs it eagerly.
  absl::Status GraphStep(std::span<const ForwardItem> items,
                         std::vector<float>* logits, bool* ran);
  // Embedding, every layer (calling on_layer_done after each when set; not
  // under capture) and the final residual add: x_ holds the last hidden
  // states of v.num_tokens rows.
  absl::Status Body(const StepView& v, const LayerDoneFn& on_layer_done);
  absl::Status Layer(int64_t l, const StepView& v);
  absl::Status Attention(int64_t l, const StepView& v);
  // Logit rows [r0, r0 + n) of the step, n <= the logits buffer's rows:
  // gather, final norm, LM head GEMM into logits_ (rows 0 .. n - 1).
  absl::Status LmHeadRows(const StepView& v, int64_t r0, int64_t n);
  // Every logit row of an eager step, pass by pass, onto the host.
  absl::Status LmHead(const StepView& v, std::vector<float>* logits);

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
  // Outgrown meta_ / decode_workspace_ buffers, freed with the runner (a
  // cudaFree mid-serving would wait on every stream; EnsureDeviceBytes).
  std::vector<DeviceAllocation> retired_;

  ForwardPlan plan_;
  int64_t eager_steps_ = 0;

  // The graph path; fixed addresses for the runner's lifetime.
  int64_t graph_max_batch_ = 0;     // 0: no graphs
  int64_t max_blocks_per_seq_ = 0;  // ceil(context_length / block_size)
  bool graphs_enabled_ = true;
  DeviceAllocation graph_meta_;       // int32, the largest bucket's layout
  DeviceAllocation graph_workspace_;  // decode workspace, largest bucket
  PinnedInt32Buffer graph_staging_;   // host side of graph_meta_
  std::unique_ptr<DecodeGraphCache> graphs_;
  int64_t graph_launches_ = 0;
};

}  // namespace baton

#endif  // BATON_WORKER_CUDA_CUDA_MODEL_RUNNER_H_
