#include "worker/cuda/device_weights.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cuda/dequantize.h"

namespace baton {

absl::StatusOr<const uint16_t*> DeviceWeights::Matrix(const TensorView& view,
                                                      cudaStream_t stream) {
  if (!cuda::CanDequantizeOnDevice(view.dtype) && CanDequantize(view.dtype)) {
    // A layout the host made at load (Q4_K_R): dequantized on the host and
    // uploaded as F32; the upload finishes before the values go.
    BATON_ASSIGN_OR_RETURN(std::vector<float> values, DequantizeTensor(view));
    TensorView f32 = view;
    f32.dtype = DType::kF32;
    f32.data = reinterpret_cast<const uint8_t*>(values.data());
    f32.nbytes = values.size() * sizeof(float);
    BATON_ASSIGN_OR_RETURN(const uint16_t* result, Matrix(f32, stream));
    BATON_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream),
                                     absl::StrCat("upload of ", view.name)));
    return result;
  }
  if (!cuda::CanDequantizeOnDevice(view.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", view.name, "' has type ", DTypeName(view.dtype),
        " which the device cannot dequantize"));
  }
  const int64_t n = view.NumElements();
  const uint64_t bytes = static_cast<uint64_t>(n) * sizeof(uint16_t);
  BATON_ASSIGN_OR_RETURN(DeviceAllocation out,
                         DeviceAllocation::Create(bytes, view.name));
  // The previous tensor's dequantization runs on `stream` too, so staging is
  // not overwritten before it has been read; growing it waits for that read.
  if (staging_.bytes() < view.nbytes) {
    BATON_RETURN_IF_ERROR(
        CudaStatus(cudaStreamSynchronize(stream), "weight upload"));
    BATON_RETURN_IF_ERROR(
        EnsureDeviceBytes(&staging_, view.nbytes, "weight staging"));
  }
  BATON_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(staging_.get(), view.data, view.nbytes,
                                 cudaMemcpyHostToDevice, stream),
                 absl::StrCat("cudaMemcpyAsync of ", view.name)));
  BATON_RETURN_IF_ERROR(
      CudaStatus(cuda::DequantizeToBF16(view.dtype, staging_.get(), n,
                                        out.as<uint16_t>(), stream),
                 absl::StrCat("DequantizeToBF16 of ", view.name)));
  const uint16_t* result = out.as<uint16_t>();
  total_bytes_ += bytes;
  owned_.push_back(std::move(out));
  return result;
}

absl::StatusOr<const float*> DeviceWeights::Vector(const float* host, int64_t n,
                                                   const char* what,
                                                   cudaStream_t stream) {
  if (host == nullptr) return nullptr;
  const uint64_t bytes = static_cast<uint64_t>(n) * sizeof(float);
  BATON_ASSIGN_OR_RETURN(DeviceAllocation out,
                         DeviceAllocation::Create(bytes, what));
  BATON_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(out.get(), host, bytes, cudaMemcpyHostToDevice, stream),
      absl::StrCat("cudaMemcpyAsync of ", what)));
  const float* result = out.as<float>();
  total_bytes_ += bytes;
  owned_.push_back(std::move(out));
  return result;
}

absl::StatusOr<std::unique_ptr<DeviceWeights>> DeviceWeights::Upload(
    const ModelWeights& weights, cudaStream_t stream) {
  const ModelConfig& c = weights.config();
  const int64_t q_dim = c.num_heads * c.head_dim;
  std::unique_ptr<DeviceWeights> dw(new DeviceWeights());
  BATON_ASSIGN_OR_RETURN(dw->token_embd_,
                         dw->Matrix(weights.token_embd(), stream));
  const bool tied = weights.output().data == weights.token_embd().data &&
                    weights.output().dtype == weights.token_embd().dtype;
  if (tied) {
    dw->output_ = dw->token_embd_;
  } else {
    BATON_ASSIGN_OR_RETURN(dw->output_, dw->Matrix(weights.output(), stream));
  }
  dw->matrix_bytes_ +=
      static_cast<uint64_t>(weights.output().NumElements()) * sizeof(uint16_t);
  BATON_ASSIGN_OR_RETURN(
      dw->output_norm_,
      dw->Vector(weights.output_norm(), c.hidden_size, "output_norm", stream));
  for (const LayerWeights& w : weights.layers()) {
    DeviceLayerWeights d;
    BATON_ASSIGN_OR_RETURN(d.attn_norm, dw->Vector(w.attn_norm, c.hidden_size,
                                                   "attn_norm", stream));
    BATON_ASSIGN_OR_RETURN(d.wq, dw->Matrix(w.wq, stream));
    BATON_ASSIGN_OR_RETURN(d.wk, dw->Matrix(w.wk, stream));
    BATON_ASSIGN_OR_RETURN(d.wv, dw->Matrix(w.wv, stream));
    BATON_ASSIGN_OR_RETURN(d.wo, dw->Matrix(w.wo, stream));
    BATON_ASSIGN_OR_RETURN(d.bq, dw->Vector(w.bq, q_dim, "bq", stream));
    BATON_ASSIGN_OR_RETURN(d.bk, dw->Vector(w.bk, c.kv_dim(), "bk", stream));
    BATON_ASSIGN_OR_RETURN(d.bv, dw->Vector(w.bv, c.kv_dim(), "bv", stream));
    BATON_ASSIGN_OR_RETURN(
        d.ffn_norm, dw->Vector(w.ffn_norm, c.hidden_size, "ffn_norm", stream));
    BATON_ASSIGN_OR_RETURN(d.w_gate, dw->Matrix(w.w_gate, stream));
    BATON_ASSIGN_OR_RETURN(d.w_up, dw->Matrix(w.w_up, stream));
    BATON_ASSIGN_OR_RETURN(d.w_down, dw->Matrix(w.w_down, stream));
    for (const TensorView* m :
         {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down}) {
      dw->matrix_bytes_ +=
          static_cast<uint64_t>(m->NumElements()) * sizeof(uint16_t);
    }
    dw->layers_.push_back(d);
  }
  BATON_RETURN_IF_ERROR(
      CudaStatus(cudaStreamSynchronize(stream), "weight upload"));
  dw->staging_ = DeviceAllocation();
  return dw;
}

}  // namespace baton
