#include "worker/engine/model_weights.h"

#include <sys/stat.h>

#include <functional>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/repack.h"

namespace baton {
namespace {

bool MatMulTakes(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ8_0:
      return true;
    default:
      return false;
  }
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Per-layer tensor names of the two formats: prefix + layer + "." + suffix.
constexpr LayerTensorNames kGgufLayerNames = {
    "blk.",           "attn_norm.weight",   "attn_q.weight",   "attn_k.weight",
    "attn_v.weight",  "attn_output.weight", "attn_q.bias",     "attn_k.bias",
    "attn_v.bias",    "ffn_norm.weight",    "ffn_gate.weight", "ffn_up.weight",
    "ffn_down.weight"};
constexpr LayerTensorNames kHfLayerNames = {
    "model.layers.",           "input_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "self_attn.q_proj.bias",   "self_attn.k_proj.bias",
    "self_attn.v_proj.bias",   "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",    "mlp.up_proj.weight",
    "mlp.down_proj.weight"};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::Open(
    const std::string& path, const ModelWeightsOptions& options) {
  std::unique_ptr<ModelWeights> weights(new ModelWeights());
  weights->options_ = options;
  if (absl::EndsWith(path, ".gguf")) {
    BATON_RETURN_IF_ERROR(weights->LoadGguf(path));
  } else if (IsDirectory(path) || absl::EndsWith(path, ".safetensors") ||
             absl::EndsWith(path, ".json")) {
    BATON_RETURN_IF_ERROR(weights->LoadSafetensors(path));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "model path '", path,
        "' is neither a .gguf file nor an HF folder / .safetensors file"));
  }
  return weights;
}

absl::StatusOr<TensorView> ModelWeights::Matrix(const TensorView& view,
                                                int64_t rows, int64_t cols) {
  if (view.shape.size() != 2 || view.shape[0] != rows ||
      view.shape[1] != cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", view.name, "' has shape ", ShapeToString(view.shape),
        ", expected [", rows, ", ", cols, "]"));
  }
  if (view.dtype == DType::kF32 ||
      (MatMulTakes(view.dtype) && !options_.matrices_as_f32)) {
    return view;
  }
  const std::optional<DType> repack = CpuMatMulRepackTarget(view.dtype);
  if (repack.has_value() && !options_.matrices_as_f32 && options_.repack) {
    // Repacked for the quantized kernels (repack.h): 6 to 10 bits a weight
    // instead of 32.
    BATON_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes,
                           RepackForCpuMatMul(view));
    TensorView repacked = view;
    repacked.dtype = *repack;
    repacked.data = bytes.data();
    repacked.nbytes = bytes.size();
    owned_bytes_.push_back(std::move(bytes));
    return repacked;
  }
  BATON_ASSIGN_OR_RETURN(std::vector<float> values, DequantizeTensor(view));
  auto owned = std::make_unique<float[]>(values.size());
  std::copy(values.begin(), values.end(), owned.get());
  TensorView converted = view;
  converted.dtype = DType::kF32;
  converted.data = reinterpret_cast<const uint8_t*>(owned.get());
  converted.nbytes = values.size() * sizeof(float);
  owned_.push_back(std::move(owned));
  return converted;
}

absl::StatusOr<const float*> ModelWeights::Vector(const TensorView& view,
                                                  int64_t n) {
  if (view.NumElements() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", view.name, "' has shape ",
                     ShapeToString(view.shape), ", expected ", n, " elements"));
  }
  if (view.dtype == DType::kF32) {
    return reinterpret_cast<const float*>(view.data);
  }
  BATON_ASSIGN_OR_RETURN(std::vector<float> values, DequantizeTensor(view));
  auto owned = std::make_unique<float[]>(n);
  std::copy(values.begin(), values.end(), owned.get());
  owned_.push_back(std::move(owned));
  return owned_.back().get();
}

absl::Status ModelWeights::LoadGguf(const std::string& path) {
  BATON_ASSIGN_OR_RETURN(gguf_, GgufFile::Open(path));
  BATON_ASSIGN_OR_RETURN(config_, ModelConfigFromGguf(*gguf_));
  const ModelConfig& c = config_;
  const GgufFile& f = *gguf_;
  TensorLookup get = [&](const std::string& name) { return f.GetTensor(name); };
  BATON_ASSIGN_OR_RETURN(token_embd_, get("token_embd.weight"));
  if (token_embd_.shape != std::vector<int64_t>{c.vocab_size, c.hidden_size}) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token_embd.weight has shape ", ShapeToString(token_embd_.shape)));
  }
  if (c.tie_word_embeddings) {
    BATON_ASSIGN_OR_RETURN(output_,
                           Matrix(token_embd_, c.vocab_size, c.hidden_size));
  } else {
    BATON_ASSIGN_OR_RETURN(TensorView out, get("output.weight"));
    BATON_ASSIGN_OR_RETURN(output_, Matrix(out, c.vocab_size, c.hidden_size));
  }
  BATON_ASSIGN_OR_RETURN(TensorView norm, get("output_norm.weight"));
  BATON_ASSIGN_OR_RETURN(output_norm_, Vector(norm, c.hidden_size));
  if (c.has_rope_freqs_tensor) {
    BATON_ASSIGN_OR_RETURN(TensorView freqs, get("rope_freqs.weight"));
    BATON_ASSIGN_OR_RETURN(const float* values, Vector(freqs, c.rope_dim / 2));
    rope_freqs_.assign(values, values + c.rope_dim / 2);
  }
  return LoadLayers(get, kGgufLayerNames);
}

absl::Status ModelWeights::LoadSafetensors(const std::string& path) {
  BATON_ASSIGN_OR_RETURN(safetensors_, SafetensorsModel::Open(path));
  hf_directory_ = safetensors_->directory();
  BATON_ASSIGN_OR_RETURN(
      config_, ModelConfigFromHfConfigFile(safetensors_->config_json_path()));
  const ModelConfig& c = config_;
  TensorLookup get = [&](const std::string& name) {
    return safetensors_->GetTensor(name);
  };
  BATON_ASSIGN_OR_RETURN(TensorView embed, get("model.embed_tokens.weight"));
  BATON_ASSIGN_OR_RETURN(token_embd_,
                         Matrix(embed, c.vocab_size, c.hidden_size));
  if (safetensors_->FindTensor("lm_head.weight") != nullptr) {
    BATON_ASSIGN_OR_RETURN(TensorView head, get("lm_head.weight"));
    BATON_ASSIGN_OR_RETURN(output_, Matrix(head, c.vocab_size, c.hidden_size));
    config_.tie_word_embeddings = false;
  } else {
    output_ = token_embd_;
    config_.tie_word_embeddings = true;
  }
  BATON_ASSIGN_OR_RETURN(TensorView norm, get("model.norm.weight"));
  BATON_ASSIGN_OR_RETURN(output_norm_, Vector(norm, c.hidden_size));
  return LoadLayers(get, kHfLayerNames);
}

absl::Status ModelWeights::LoadLayers(const TensorLookup& get,
                                      const LayerTensorNames& names) {
  const ModelConfig& c = config_;
  const int64_t q_dim = c.num_heads * c.head_dim;
  const int64_t hidden = c.hidden_size, kv = c.kv_dim(),
                ffn = c.intermediate_size;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    auto tensor = [&](const char* suffix) {
      return get(absl::StrCat(names.prefix, l, ".", suffix));
    };
    auto vector = [&](const char* suffix,
                      int64_t n) -> absl::StatusOr<const float*> {
      BATON_ASSIGN_OR_RETURN(TensorView t, tensor(suffix));
      return Vector(t, n);
    };
    auto matrix = [&](const char* suffix, int64_t rows,
                      int64_t cols) -> absl::StatusOr<TensorView> {
      BATON_ASSIGN_OR_RETURN(TensorView t, tensor(suffix));
      return Matrix(t, rows, cols);
    };
    LayerWeights w;
    BATON_ASSIGN_OR_RETURN(w.attn_norm, vector(names.attn_norm, hidden));
    BATON_ASSIGN_OR_RETURN(w.wq, matrix(names.wq, q_dim, hidden));
    BATON_ASSIGN_OR_RETURN(w.wk, matrix(names.wk, kv, hidden));
    BATON_ASSIGN_OR_RETURN(w.wv, matrix(names.wv, kv, hidden));
    BATON_ASSIGN_OR_RETURN(w.wo, matrix(names.wo, hidden, q_dim));
    if (c.attention_bias) {
      BATON_ASSIGN_OR_RETURN(w.bq, vector(names.bq, q_dim));
      BATON_ASSIGN_OR_RETURN(w.bk, vector(names.bk, kv));
      BATON_ASSIGN_OR_RETURN(w.bv, vector(names.bv, kv));
    }
    BATON_ASSIGN_OR_RETURN(w.ffn_norm, vector(names.ffn_norm, hidden));
    BATON_ASSIGN_OR_RETURN(w.w_gate, matrix(names.w_gate, ffn, hidden));
    BATON_ASSIGN_OR_RETURN(w.w_up, matrix(names.w_up, ffn, hidden));
    BATON_ASSIGN_OR_RETURN(w.w_down, matrix(names.w_down, hidden, ffn));
    layers_.push_back(w);
  }
  return absl::OkStatus();
}

uint64_t ModelWeights::matrix_bytes() const {
  uint64_t total = output_.nbytes;
  for (const LayerWeights& w : layers_) {
    total += w.wq.nbytes + w.wk.nbytes + w.wv.nbytes + w.wo.nbytes +
             w.w_gate.nbytes + w.w_up.nbytes + w.w_down.nbytes;
  }
  return total;
}

}  // namespace baton
