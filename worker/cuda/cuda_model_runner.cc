#include "worker/cuda/cuda_model_runner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/paged_attention.h"

namespace baton {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxGraphBatch = 4096;

// Everything Create can check without a device.
absl::Status CheckShapes(const ModelConfig& c, const KvLayout& layout,
                         int64_t num_blocks, const CudaRunnerOptions& o) {
  BATON_RETURN_IF_ERROR(CheckKvLayoutFitsModel(c, layout, "CUDA"));
  BATON_RETURN_IF_ERROR(layout.Validate());
  if (num_blocks < 1 || num_blocks > kInt32Max) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_blocks must be in [1, 2^31 - 1], got ", num_blocks));
  }
  if (c.head_dim != 64 && c.head_dim != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CUDA attention kernels support head_dim 64 or 128, "
                     "the model has ",
                     c.head_dim));
  }
  if (c.num_kv_heads < 1 || c.num_heads % c.num_kv_heads != 0 ||
      c.gqa_group() > cuda::kPagedAttentionMaxGroup) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CUDA attention kernels need num_heads (", c.num_heads,
                     ") to be a multiple of num_kv_heads (", c.num_kv_heads,
                     ") with at most ", cuda::kPagedAttentionMaxGroup,
                     " query heads per KV head"));
  }
  if (c.context_length < 1 || c.context_length > kInt32Max) {
    return absl::InvalidArgumentError(absl::StrCat(
        "context length ", c.context_length, " is outside [1, 2^31 - 1]"));
  }
  if (o.max_batch_tokens < 1 || o.max_batch_tokens > kInt32Max) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_batch_tokens must be in [1, 2^31 - 1], got ", o.max_batch_tokens));
  }
  if (o.max_logits_rows < 1 || o.max_logits_rows > kInt32Max) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_logits_rows must be in [1, 2^31 - 1], got ", o.max_logits_rows));
  }
  if (o.cuda_graphs &&
      (o.max_graph_batch < 1 || o.max_graph_batch > kMaxGraphBatch)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_graph_batch must be in [1, ", kMaxGraphBatch,
                     "], got ", o.max_graph_batch));
  }
  if (o.device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device must be >= 0, got ", o.device));
  }
  if (o.allocator != nullptr &&
      (!(o.allocator->layout() == layout) ||
       o.allocator->num_blocks_total() != num_blocks)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the allocator's pool (", o.allocator->layout().ToString(),
                     ", ", o.allocator->num_blocks_total(),
                     " blocks) differs from the device "
                     "pool (",
                     layout.ToString(), ", ", num_blocks, " blocks)"));
  }
  const uint64_t per_layer =
      static_cast<uint64_t>(num_blocks) * layout.chunk_bytes();
  if (per_layer / layout.chunk_bytes() != static_cast<uint64_t>(num_blocks) ||
      per_layer > std::numeric_limits<uint64_t>::max() / layout.num_layers) {
    return absl::InvalidArgumentError("the KV pool size overflows 64 bits");
  }
  return absl::OkStatus();
}

// FailedPrecondition (no usable device) or InvalidArgument (bad index).
absl::Status SelectDevice(int device) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "no usable CUDA device: cudaGetDeviceCount: ", cudaGetErrorName(err),
        " (", cudaGetErrorString(err), ")"));
  }
  if (count == 0) {
    return absl::FailedPreconditionError(
        "no usable CUDA device: cudaGetDeviceCount reports 0 devices");
  }
  if (device >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device ", device, " is outside the ", count, " CUDA devices"));
  }
  err = cudaSetDevice(device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("cudaSetDevice(", device, "): ", cudaGetErrorName(err),
                     " (", cudaGetErrorString(err), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaModelRunner>> CudaModelRunner::Create(
    const ModelWeights* weights, const KvLayout& layout, int64_t num_blocks,
    const CudaRunnerOptions& options) {
  if (weights == nullptr) {
    return absl::InvalidArgumentError("the CUDA model runner needs weights");
  }
  BATON_RETURN_IF_ERROR(
      CheckShapes(weights->config(), layout, num_blocks, options));
  BATON_ASSIGN_OR_RETURN(RopeOptions rope, ModelRopeOptions(*weights));
  // The same checks the device upload makes, with RopeTable's messages.
  BATON_RETURN_IF_ERROR(RopeTable::Create(rope).status());
  BATON_RETURN_IF_ERROR(SelectDevice(options.device));
  std::unique_ptr<CudaModelRunner> runner(
      new CudaModelRunner(weights->config(), layout, num_blocks, options));
  BATON_RETURN_IF_ERROR(runner->Init(*weights, rope));
  return runner;
}

absl::Status CudaModelRunner::Init(const ModelWeights& weights,
                                   const RopeOptions& rope) {
  BATON_RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                 "cudaStreamCreateWithFlags"));
  BATON_RETURN_IF_ERROR(
      CudaStatus(cudaEventCreateWithFlags(&kv_written_, cudaEventDisableTiming),
                 "cudaEventCreateWithFlags"));
  BATON_ASSIGN_OR_RETURN(weights_, DeviceWeights::Upload(weights, stream_));
  BATON_ASSIGN_OR_RETURN(gemm_, cuda::CudaGemm::Create(stream_));
  const uint64_t pool_bytes = static_cast<uint64_t>(layout_.num_layers) *
                              num_blocks_ * layout_.chunk_bytes();
  BATON_ASSIGN_OR_RETURN(
      pool_,
      DeviceAllocation::Create(
          pool_bytes, absl::StrCat("the KV pool (", num_blocks_, " blocks)")));
  BATON_RETURN_IF_ERROR(CudaStatus(
      cudaMemsetAsync(pool_.get(), 0, pool_bytes, stream_), "cudaMemsetAsync"));
  const int64_t rope_elems = cuda::RopeTableElements(rope);
  const uint64_t rope_bytes = static_cast<uint64_t>(rope_elems) * 4;
  BATON_ASSIGN_OR_RETURN(rope_cos_,
                         DeviceAllocation::Create(rope_bytes, "rope cos"));
  BATON_ASSIGN_OR_RETURN(rope_sin_,
                         DeviceAllocation::Create(rope_bytes, "rope sin"));
  BATON_RETURN_IF_ERROR(
      CudaStatus(cuda::UploadRopeTable(rope, rope_cos_.as<float>(),
                                       rope_sin_.as<float>(), &rope_, stream_),
                 "UploadRopeTable"));
  attention_scale_ = static_cast<float>(
      1.0 / std::sqrt(static_cast<double>(config_.head_dim)));
  BATON_RETURN_IF_ERROR(AllocateActivations());
  BATON_RETURN_IF_ERROR(AllocateGraphResources());
  return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

absl::Status CudaModelRunner::AllocateGraphResources() {
  if (!options_.cuda_graphs) return absl::OkStatus();
  const ModelConfig& c = config_;
  graph_max_batch_ =
      std::min({options_.max_graph_batch, options_.max_batch_tokens,
                options_.max_logits_rows});
  max_blocks_per_seq_ =
      (c.context_length + layout_.block_size - 1) / layout_.block_size;
  // Every smaller bucket's layout is smaller: one buffer serves them all.
  const DecodeGraphLayout largest =
      MakeDecodeGraphLayout(graph_max_batch_, max_blocks_per_seq_);
  BATON_ASSIGN_OR_RETURN(
      graph_meta_,
      DeviceAllocation::Create(static_cast<uint64_t>(largest.total) * 4,
                               "decode graph metadata"));
  BATON_ASSIGN_OR_RETURN(graph_staging_,
                         PinnedInt32Buffer::Create(largest.total));
  BATON_ASSIGN_OR_RETURN(
      graph_workspace_,
      DeviceAllocation::Create(
          cuda::PagedDecodeWorkspaceBytes(graph_max_batch_, c.num_heads,
                                          c.head_dim, c.context_length),
          "decode graph attention workspace"));
  graphs_ = std::make_unique<DecodeGraphCache>();
  return absl::OkStatus();
}

absl::Status CudaModelRunner::AllocateActivations() {
  const ModelConfig& c = config_;
  const uint64_t t = static_cast<uint64_t>(options_.max_batch_tokens);
  const uint64_t q_dim = c.num_heads * c.head_dim;
  const uint64_t widest =
      std::max<uint64_t>({static_cast<uint64_t>(c.hidden_size), q_dim,
                          static_cast<uint64_t>(c.intermediate_size)});
  const uint64_t logit_rows =
      std::min(options_.max_logits_rows, options_.max_batch_tokens);
  struct Buffer {
    DeviceAllocation* allocation;
    uint64_t bytes;
    const char* what;
  };
  const Buffer buffers[] = {
      {&x_, t * c.hidden_size * 4, "activations x"},
      {&h_, t * c.hidden_size * 4, "activations h"},
      {&delta_, t * c.hidden_size * 4, "activations delta"},
      {&gemm_in_, t * widest * 2, "bf16 GEMM inputs"},
      {&q_, t * q_dim * 4, "queries"},
      {&k_, t * c.kv_dim() * 4, "keys"},
      {&v_, t * c.kv_dim() * 4, "values"},
      {&attn_, t * q_dim * 4, "attention output"},
      {&gate_, t * c.intermediate_size * 4, "MLP gate"},
      {&up_, t * c.intermediate_size * 4, "MLP up"},
      {&logits_, logit_rows * c.vocab_size * 4, "device logits"},
      // Step metadata grows on demand; this covers batches of short contexts.
      {&meta_, (8 * t + 1024) * 4, "step metadata"},
  };
  for (const Buffer& b : buffers) {
    BATON_ASSIGN_OR_RETURN(*b.allocation,
                           DeviceAllocation::Create(b.bytes, b.what));
  }
  return absl::OkStatus();
}

CudaModelRunner::~CudaModelRunner() {
  cudaSetDevice(device_);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  graphs_.reset();
  gemm_.reset();
  if (kv_written_ != nullptr) cudaEventDestroy(kv_written_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  // Device allocations are freed by their destructors (cudaFree needs no
  // stream).
}

absl::Status CudaModelRunner::Fail(absl::Status status) {
  if (unhealthy_reason_.ok()) unhealthy_reason_ = status;
  return status;
}

absl::Status CudaModelRunner::Forward(std::span<const ForwardItem> items,
                                      std::vector<float>* logits,
                                      const LayerDoneFn& on_layer_done) {
  if (!healthy()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the CUDA model runner is unhealthy after: ",
                     unhealthy_reason_.ToString()));
  }
  if (logits == nullptr) {
    return absl::InvalidArgumentError("Forward needs a logits vector");
  }
  ForwardLimits limits;
  limits.vocab_size = config_.vocab_size;
  limits.context_length = config_.context_length;
  limits.block_size = layout_.block_size;
  limits.num_blocks = num_blocks_;
  limits.max_batch_tokens = options_.max_batch_tokens;
  BATON_RETURN_IF_ERROR(ValidateForwardItems(items, limits));
  if (items.empty()) {
    logits->clear();
    return absl::OkStatus();
  }
  absl::Status status = Step(items, logits, on_layer_done);
  // Out of device memory for a step's buffers (cudaMalloc's error is not
  // sticky): this batch fails, the device stays usable.
  if (absl::IsResourceExhausted(status)) return status;
  if (!status.ok()) return Fail(std::move(status));
  if (options_.allocator != nullptr) {
    for (const ForwardItem& item : items) {
      BATON_RETURN_IF_ERROR(options_.allocator->SetNumTokens(
          *item.table,
          item.start_pos + static_cast<int64_t>(item.tokens.size())));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaModelRunner::Step(std::span<const ForwardItem> items,
                                   std::vector<float>* logits,
                                   const LayerDoneFn& on_layer_done) {
  BATON_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  if (graph_max_batch_ > 0 && graphs_enabled_ &&
      DecodeGraphEligible(items, static_cast<bool>(on_layer_done),
                          graph_max_batch_)) {
    bool ran = false;
    BATON_RETURN_IF_ERROR(GraphStep(items, logits, &ran));
    if (ran) return absl::OkStatus();
  }
  return EagerStep(items, logits, on_layer_done);
}

absl::Status CudaModelRunner::EagerStep(std::span<const ForwardItem> items,
                                        std::vector<float>* logits,
                                        const LayerDoneFn& on_layer_done) {
  BuildForwardPlan(items, layout_.block_size, &plan_);
  const uint64_t meta_bytes = plan_.packed.size() * sizeof(int32_t);
  BATON_RETURN_IF_ERROR(
      EnsureDeviceBytes(&meta_, meta_bytes, "step metadata", &retired_));
  if (plan_.all_single_token) {
    BATON_RETURN_IF_ERROR(EnsureDeviceBytes(
        &decode_workspace_,
        cuda::PagedDecodeWorkspaceBytes(plan_.num_seqs, config_.num_heads,
                                        config_.head_dim,
                                        plan_.max_context_len),
        "decode attention workspace", &retired_));
  }
  // From pageable memory: returns once plan_.packed has been staged.
  BATON_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(meta_.get(), plan_.packed.data(), meta_bytes,
                                 cudaMemcpyHostToDevice, stream_),
                 "metadata upload"));
  StepView v;
  v.num_tokens = plan_.num_tokens;
  v.num_seqs = plan_.num_seqs;
  v.all_single_token = plan_.all_single_token;
  v.max_queries_per_seq = plan_.max_queries_per_seq;
  v.max_context_len = plan_.max_context_len;
  v.num_logit_rows = plan_.num_logit_rows;
  v.meta = meta_.as<int32_t>();
  v.offsets = plan_.offsets;
  v.decode_workspace = decode_workspace_.get();
  v.decode_workspace_bytes = decode_workspace_.bytes();
  v.record_kv_event = true;
  BATON_RETURN_IF_ERROR(Body(v, on_layer_done));
  BATON_RETURN_IF_ERROR(LmHead(v, logits));
  BATON_RETURN_IF_ERROR(
      CudaStatus(cudaStreamSynchronize(stream_), "end of step"));
  ++eager_steps_;
  return absl::OkStatus();
}

absl::Status CudaModelRunner::Body(const StepView& v,
                                   const LayerDoneFn& on_layer_done) {
  BATON_RETURN_IF_ERROR(CudaStatus(
      cuda::EmbeddingBF16(v.Meta(v.offsets.token_ids), v.num_tokens,
                          weights_->token_embd(), config_.vocab_size,
                          config_.hidden_size, x_.as<float>(), stream_),
      "EmbeddingBF16"));
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    BATON_RETURN_IF_ERROR(Layer(l, v));
    if (on_layer_done) {
      BATON_RETURN_IF_ERROR(
          CudaStatus(cudaEventSynchronize(kv_written_),
                     absl::StrCat("layer ", l, " K/V write (event)")));
      on_layer_done(l);
    }
  }
  // The last layer's down projection joins the residual stream.
  return CudaStatus(
      cuda::AddInPlace(x_.as<float>(), delta_.as<float>(),
                       v.num_tokens * config_.hidden_size, stream_),
      "final residual AddInPlace");
}

std::vector<DecodeGraphKey> CudaModelRunner::captured_graphs() const {
  return graphs_ != nullptr ? graphs_->captured()
                            : std::vector<DecodeGraphKey>();
}

std::vector<std::pair<DecodeGraphKey, absl::Status>>
CudaModelRunner::graph_failures() const {
  return graphs_ != nullptr
             ? graphs_->failures()
             : std::vector<std::pair<DecodeGraphKey, absl::Status>>();
}

}  // namespace baton
