// A Llama model's weights in GPU memory, uploaded from ModelWeights: every
// matrix as bfloat16 (dequantized on the device from the raw GGUF blocks),
// norm weights and biases as float32.
#ifndef BATON_WORKER_CUDA_DEVICE_WEIGHTS_H_
#define BATON_WORKER_CUDA_DEVICE_WEIGHTS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/cuda/device_memory.h"
#include "worker/engine/model_weights.h"

namespace baton {

// Device pointers of one layer; shapes as LayerWeights (matrices [out][in]
// row-major bfloat16 bits, vectors float32).
struct DeviceLayerWeights {
  const float* attn_norm = nullptr;  // [hidden]
  const uint16_t* wq = nullptr;      // [heads * head_dim][hidden]
  const uint16_t* wk = nullptr;      // [kv_dim][hidden]
  const uint16_t* wv = nullptr;      // [kv_dim][hidden]
  const uint16_t* wo = nullptr;      // [hidden][heads * head_dim]
  const float* bq = nullptr;         // [heads * head_dim] or null
  const float* bk = nullptr;         // [kv_dim] or null
  const float* bv = nullptr;         // [kv_dim] or null
  const float* ffn_norm = nullptr;   // [hidden]
  const uint16_t* w_gate = nullptr;  // [ffn][hidden]
  const uint16_t* w_up = nullptr;    // [ffn][hidden]
  const uint16_t* w_down = nullptr;  // [hidden][ffn]
};

class DeviceWeights {
 public:
  // Uploads `weights` to the current device through `stream` and waits for
  // it. The output projection shares the token embedding's device copy when
  // ModelWeights ties them (output() views the token_embd data).
  // InvalidArgument for a tensor type the device cannot dequantize;
  // ResourceExhausted (naming the tensor and bytes) when device memory runs
  // out; Internal naming the CUDA call for other device errors.
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> Upload(
      const ModelWeights& weights, cudaStream_t stream);

  DeviceWeights(const DeviceWeights&) = delete;
  DeviceWeights& operator=(const DeviceWeights&) = delete;

  const uint16_t* token_embd() const { return token_embd_; }  // [vocab][hid]
  const uint16_t* output() const { return output_; }          // [vocab][hid]
  const float* output_norm() const { return output_norm_; }   // [hidden]
  const std::vector<DeviceLayerWeights>& layers() const { return layers_; }
  bool tied_output() const { return token_embd_ == output_; }

  // Bytes of matrices one decode step reads: every layer matrix and the
  // output projection, bfloat16.
  uint64_t matrix_bytes() const { return matrix_bytes_; }
  // Bytes of device memory the weights occupy.
  uint64_t total_bytes() const { return total_bytes_; }

 private:
  DeviceWeights() = default;
  // A bfloat16 device copy of `view` (rows * cols elements).
  absl::StatusOr<const uint16_t*> Matrix(const TensorView& view,
                                         cudaStream_t stream);
  // A float32 device copy of n host floats; null for a null `host`.
  absl::StatusOr<const float*> Vector(const float* host, int64_t n,
                                      const char* what, cudaStream_t stream);

  const uint16_t* token_embd_ = nullptr;
  const uint16_t* output_ = nullptr;
  const float* output_norm_ = nullptr;
  std::vector<DeviceLayerWeights> layers_;
  uint64_t matrix_bytes_ = 0;
  uint64_t total_bytes_ = 0;
  DeviceAllocation staging_;  // raw tensor bytes on their way to Matrix
  std::vector<DeviceAllocation> owned_;
};

}  // namespace baton

#endif  // BATON_WORKER_CUDA_DEVICE_WEIGHTS_H_
