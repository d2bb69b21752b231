// A Llama-family model's weights, resolved by role from a GGUF file or an HF
// safetensors checkpoint, ready for the forward pass: matrices as TensorViews
// of a type MatMul takes (mapped in place when possible), norm weights and
// biases as f32.
#ifndef BATON_WORKER_ENGINE_MODEL_WEIGHTS_H_
#define BATON_WORKER_ENGINE_MODEL_WEIGHTS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config/model_config.h"
#include "model/gguf/gguf_file.h"
#include "model/safetensors/safetensors_model.h"
#include "model/tensor.h"

namespace baton {

struct LayerWeights {
  const float* attn_norm = nullptr;  // [hidden]
  TensorView wq, wk, wv,
      wo;  // [heads*hd, hidden], [kv_dim, hidden] x2, [hidden, heads*hd]
  const float* bq = nullptr;        // [heads*hd] or null
  const float* bk = nullptr;        // [kv_dim] or null
  const float* bv = nullptr;        // [kv_dim] or null
  const float* ffn_norm = nullptr;  // [hidden]
  TensorView w_gate, w_up;          // [ffn, hidden]
  TensorView w_down;                // [hidden, ffn]
};

// Names of one layer's tensors in a file format.
struct LayerTensorNames {
  const char* prefix;  // followed by the layer index and "."
  const char* attn_norm;
  const char *wq, *wk, *wv, *wo;
  const char *bq, *bk, *bv;
  const char* ffn_norm;
  const char *w_gate, *w_up, *w_down;
};

struct ModelWeightsOptions {
  // Every matrix dequantized to f32 at load, so MatMul multiplies f32
  // activations by the exact weights: the precision reference that the
  // quantized paths (8-bit activations on the CPU, bf16 on a GPU) are
  // measured against. Four bytes per weight.
  bool matrices_as_f32 = false;
  // Q4_K, Q6_K and Q5_0 matrices repacked for the quantized kernels
  // (CpuMatMulRepackTarget); false converts them to f32 like the types the
  // matmul has no kernel for (the load before the repacked layouts, kept for
  // side-by-side benchmarks).
  bool repack = true;
};

using TensorLookup =
    std::function<absl::StatusOr<TensorView>(const std::string& name)>;

class ModelWeights {
 public:
  // Opens `path`: a .gguf file, or an HF folder (config.json + safetensors),
  // an index .json or a .safetensors file beside a config.json.
  static absl::StatusOr<std::unique_ptr<ModelWeights>> Open(
      const std::string& path, const ModelWeightsOptions& options = {});

  ModelWeights(const ModelWeights&) = delete;
  ModelWeights& operator=(const ModelWeights&) = delete;

  const ModelConfig& config() const { return config_; }
  // The GGUF file when loaded from one (the tokenizer reads its metadata).
  const GgufFile* gguf() const { return gguf_.get(); }
  // The checkpoint folder when loaded from safetensors, else empty.
  const std::string& hf_directory() const { return hf_directory_; }

  const TensorView& token_embd() const {
    return token_embd_;
  }                                                     // [vocab, hidden]
  const TensorView& output() const { return output_; }  // [vocab, hidden]
  const float* output_norm() const { return output_norm_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  // Per-pair RoPE frequency divisors from a rope_freqs tensor, or empty.
  const std::vector<double>& rope_freq_factors() const { return rope_freqs_; }
  // Bytes of weights read per decode step (every matrix once).
  uint64_t matrix_bytes() const;

 private:
  ModelWeights() = default;
  absl::Status LoadGguf(const std::string& path);
  absl::Status LoadSafetensors(const std::string& path);
  // Every layer's tensors, resolved through `get` by `names`.
  absl::Status LoadLayers(const TensorLookup& get,
                          const LayerTensorNames& names);
  // A matrix for MatMul: `view` itself if its type is supported, else a
  // converted f32 copy kept alive here. Checks the shape.
  absl::StatusOr<TensorView> Matrix(const TensorView& view, int64_t rows,
                                    int64_t cols);
  // A [n] vector as f32 (converted copy unless already f32).
  absl::StatusOr<const float*> Vector(const TensorView& view, int64_t n);

  ModelWeightsOptions options_;
  ModelConfig config_;
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<SafetensorsModel> safetensors_;
  std::string hf_directory_;
  TensorView token_embd_;
  TensorView output_;
  const float* output_norm_ = nullptr;
  std::vector<LayerWeights> layers_;
  std::vector<double> rope_freqs_;
  std::vector<std::unique_ptr<float[]>> owned_;    // converted tensors
  std::vector<std::vector<uint8_t>> owned_bytes_;  // repacked tensors
};

}  // namespace baton

#endif  // BATON_WORKER_ENGINE_MODEL_WEIGHTS_H_
