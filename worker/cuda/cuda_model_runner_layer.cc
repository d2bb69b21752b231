// One transformer layer, the attention call and the LM head of
// CudaModelRunner's step (eager or under graph capture: nothing here
// allocates, copies to or from the host or synchronizes, except the eager
// LmHead's downloads). Every op is enqueued on stream_; shapes are
// [v.num_tokens][width] unless stated.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/rms_norm.h"
#include "worker/cuda/cuda_model_runner.h"
#include "worker/cuda/runner_kernels.h"

namespace baton {
namespace {

absl::Status LayerOp(cudaError_t err, int64_t layer, absl::string_view op) {
  if (err == cudaSuccess) return absl::OkStatus();
  return CudaStatus(err, absl::StrCat("layer ", layer, " ", op));
}

// A GEMM failure keeps its code; the message names the op.
absl::Status GemmOp(const absl::Status& status, int64_t layer,
                    absl::string_view op) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("layer ", layer, " GEMM ", op,
                                                  ": ", status.message()));
}

}  // namespace

absl::Status CudaModelRunner::Layer(int64_t l, const StepView& v) {
  const ModelConfig& c = config_;
  const DeviceLayerWeights& w = weights_->layers()[l];
  const int64_t t = v.num_tokens;
  const int64_t hidden = c.hidden_size, ffn = c.intermediate_size;
  const int64_t q_dim = c.num_heads * c.head_dim, kv_dim = c.kv_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);
  float* x = x_.as<float>();
  float* h = h_.as<float>();
  float* delta = delta_.as<float>();
  uint16_t* in = gemm_in_.as<uint16_t>();
  float* q = q_.as<float>();
  float* k = k_.as<float>();
  float* val = v_.as<float>();
  float* gate = gate_.as<float>();
  float* up = up_.as<float>();
  const int32_t* positions = v.Meta(v.offsets.positions);

  // x += delta (the previous layer's MLP output), h = RmsNorm(x).
  if (l == 0) {
    BATON_RETURN_IF_ERROR(
        LayerOp(cuda::RmsNorm(x, w.attn_norm, t, hidden, eps, h, stream_), l,
                "attention RmsNorm"));
  } else {
    BATON_RETURN_IF_ERROR(LayerOp(
        cuda::AddRmsNorm(x, delta, w.attn_norm, t, hidden, eps, h, stream_), l,
        "attention AddRmsNorm"));
  }
  BATON_RETURN_IF_ERROR(LayerOp(cuda::F32ToBF16(h, t * hidden, in, stream_), l,
                                "F32ToBF16 (attention input)"));
  BATON_RETURN_IF_ERROR(
      GemmOp(gemm_->MatmulBf16(in, w.wq, q, t, q_dim, hidden), l, "wq"));
  BATON_RETURN_IF_ERROR(
      GemmOp(gemm_->MatmulBf16(in, w.wk, k, t, kv_dim, hidden), l, "wk"));
  BATON_RETURN_IF_ERROR(
      GemmOp(gemm_->MatmulBf16(in, w.wv, val, t, kv_dim, hidden), l, "wv"));
  if (w.bq != nullptr) {
    BATON_RETURN_IF_ERROR(
        LayerOp(cuda::AddBias(q, w.bq, t, q_dim, stream_), l, "AddBias q"));
    BATON_RETURN_IF_ERROR(
        LayerOp(cuda::AddBias(k, w.bk, t, kv_dim, stream_), l, "AddBias k"));
    BATON_RETURN_IF_ERROR(
        LayerOp(cuda::AddBias(val, w.bv, t, kv_dim, stream_), l, "AddBias v"));
  }
  BATON_RETURN_IF_ERROR(
      LayerOp(cuda::ApplyRope(rope_, positions, t, q, c.num_heads, k,
                              c.num_kv_heads, stream_),
              l, "ApplyRope"));
  cuda::KvPoolShape shape;
  shape.num_layers = layout_.num_layers;
  shape.num_blocks = num_blocks_;
  shape.num_kv_heads = layout_.num_kv_heads;
  shape.head_dim = layout_.head_dim;
  shape.block_size = layout_.block_size;
  BATON_RETURN_IF_ERROR(LayerOp(
      cuda::WriteKvF16(k, val, positions, v.Meta(v.offsets.token_blocks), t,
                       shape, l, pool_.as<uint16_t>(), stream_),
      l, "WriteKvF16"));
  if (v.record_kv_event) {
    BATON_RETURN_IF_ERROR(
        LayerOp(cudaEventRecord(kv_written_, stream_), l, "cudaEventRecord"));
  }
  BATON_RETURN_IF_ERROR(Attention(l, v));
  BATON_RETURN_IF_ERROR(
      LayerOp(cuda::F32ToBF16(attn_.as<float>(), t * q_dim, in, stream_), l,
              "F32ToBF16 (attention output)"));
  BATON_RETURN_IF_ERROR(
      GemmOp(gemm_->MatmulBf16(in, w.wo, delta, t, hidden, q_dim), l, "wo"));

  // x += attention output, h = RmsNorm(x).
  BATON_RETURN_IF_ERROR(LayerOp(
      cuda::AddRmsNorm(x, delta, w.ffn_norm, t, hidden, eps, h, stream_), l,
      "MLP AddRmsNorm"));
  BATON_RETURN_IF_ERROR(LayerOp(cuda::F32ToBF16(h, t * hidden, in, stream_), l,
                                "F32ToBF16 (MLP input)"));
  BATON_RETURN_IF_ERROR(GemmOp(
      gemm_->MatmulBf16(in, w.w_gate, gate, t, ffn, hidden), l, "w_gate"));
  BATON_RETURN_IF_ERROR(
      GemmOp(gemm_->MatmulBf16(in, w.w_up, up, t, ffn, hidden), l, "w_up"));
  BATON_RETURN_IF_ERROR(
      LayerOp(cuda::SwiGlu(gate, up, t * ffn, gate, stream_), l, "SwiGlu"));
  BATON_RETURN_IF_ERROR(LayerOp(cuda::F32ToBF16(gate, t * ffn, in, stream_), l,
                                "F32ToBF16 (MLP hidden)"));
  // delta joins x at the next layer's norm (or before the final norm).
  return GemmOp(gemm_->MatmulBf16(in, w.w_down, delta, t, hidden, ffn), l,
                "w_down");
}

absl::Status CudaModelRunner::Attention(int64_t l, const StepView& v) {
  const ModelConfig& c = config_;
  const ForwardPlanOffsets& o = v.offsets;
  cuda::PagedKvPoolView kv;
  kv.pool = pool_.as<uint16_t>();
  kv.layer = l;
  kv.num_blocks = num_blocks_;
  kv.num_kv_heads = layout_.num_kv_heads;
  kv.head_dim = layout_.head_dim;
  kv.block_size = layout_.block_size;
  cuda::DeviceBlockTables tables;
  tables.block_ids = v.Meta(o.block_ids);
  tables.row_offsets = v.Meta(o.row_offsets);
  if (v.all_single_token) {
    cuda::PagedDecodeBatch batch;
    batch.num_seqs = static_cast<int32_t>(v.num_seqs);
    batch.max_context_len = v.max_context_len;
    batch.context_lens = v.Meta(o.context_lens);
    batch.tables = tables;
    return LayerOp(cuda::PagedAttentionDecode(
                       q_.as<float>(), batch, kv, c.num_heads, attention_scale_,
                       v.decode_workspace, v.decode_workspace_bytes,
                       attn_.as<float>(), stream_),
                   l, "PagedAttentionDecode");
  }
  cuda::PagedPrefillBatch batch;
  batch.num_seqs = static_cast<int32_t>(v.num_seqs);
  batch.num_tokens = static_cast<int32_t>(v.num_tokens);
  batch.max_queries_per_seq = v.max_queries_per_seq;
  batch.cu_seqlens_q = v.Meta(o.cu_seqlens);
  batch.start_pos = v.Meta(o.start_pos);
  batch.tables = tables;
  return LayerOp(
      cuda::PagedAttentionPrefill(q_.as<float>(), batch, kv, c.num_heads,
                                  attention_scale_, attn_.as<float>(), stream_),
      l, "PagedAttentionPrefill");
}

absl::Status CudaModelRunner::LmHeadRows(const StepView& v, int64_t r0,
                                         int64_t n) {
  const ModelConfig& c = config_;
  const float eps = static_cast<float>(c.rms_norm_eps);
  float* h = h_.as<float>();
  uint16_t* in = gemm_in_.as<uint16_t>();
  BATON_RETURN_IF_ERROR(
      CudaStatus(cuda::GatherRows(x_.as<float>(), v.num_tokens,
                                  v.Meta(v.offsets.logit_rows + r0), n,
                                  c.hidden_size, h, stream_),
                 "LM head GatherRows"));
  BATON_RETURN_IF_ERROR(
      CudaStatus(cuda::RmsNorm(h, weights_->output_norm(), n, c.hidden_size,
                               eps, h, stream_),
                 "final RmsNorm"));
  BATON_RETURN_IF_ERROR(
      CudaStatus(cuda::F32ToBF16(h, n * c.hidden_size, in, stream_),
                 "F32ToBF16 (LM head)"));
  const absl::Status gemm =
      gemm_->MatmulBf16(in, weights_->output(), logits_.as<float>(), n,
                        c.vocab_size, c.hidden_size);
  if (!gemm.ok()) {
    return absl::Status(gemm.code(),
                        absl::StrCat("LM head GEMM: ", gemm.message()));
  }
  return absl::OkStatus();
}

absl::Status CudaModelRunner::LmHead(const StepView& v,
                                     std::vector<float>* logits) {
  const int64_t rows = v.num_logit_rows;
  const int64_t vocab = config_.vocab_size;
  logits->resize(static_cast<size_t>(rows * vocab));
  const int64_t chunk =
      std::min(options_.max_logits_rows, options_.max_batch_tokens);
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    BATON_RETURN_IF_ERROR(LmHeadRows(v, r0, n));
    // Into pageable memory: returns once the rows are on the host.
    BATON_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(logits->data() + r0 * vocab, logits_.get(),
                        static_cast<size_t>(n * vocab) * sizeof(float),
                        cudaMemcpyDeviceToHost, stream_),
        "logits download"));
  }
  return absl::OkStatus();
}

}  // namespace baton
