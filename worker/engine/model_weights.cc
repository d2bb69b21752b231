#include "worker/engine/model_weights.h"

#include <sys/stat.h>

#include <functional>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/dequantize.h"

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

// Resolves tensors by role for one file format.
using Lookup = std::function<absl::StatusOr<TensorView>(const std::string&)>;

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::Open(
    const std::string& path) {
  std::unique_ptr<ModelWeights> weights(new ModelWeights());
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
  if (MatMulTakes(view.dtype)) return view;
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
  auto get = [&](const std::string& name) { return f.GetTensor(name); };
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
  const int64_t q_dim = c.num_heads * c.head_dim;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    auto name = [&](const char* suffix) {
      return absl::StrCat("blk.", l, ".", suffix);
    };
    LayerWeights w;
    BATON_ASSIGN_OR_RETURN(TensorView t, get(name("attn_norm.weight")));
    BATON_ASSIGN_OR_RETURN(w.attn_norm, Vector(t, c.hidden_size));
    BATON_ASSIGN_OR_RETURN(t, get(name("attn_q.weight")));
    BATON_ASSIGN_OR_RETURN(w.wq, Matrix(t, q_dim, c.hidden_size));
    BATON_ASSIGN_OR_RETURN(t, get(name("attn_k.weight")));
    BATON_ASSIGN_OR_RETURN(w.wk, Matrix(t, c.kv_dim(), c.hidden_size));
    BATON_ASSIGN_OR_RETURN(t, get(name("attn_v.weight")));
    BATON_ASSIGN_OR_RETURN(w.wv, Matrix(t, c.kv_dim(), c.hidden_size));
    BATON_ASSIGN_OR_RETURN(t, get(name("attn_output.weight")));
    BATON_ASSIGN_OR_RETURN(w.wo, Matrix(t, c.hidden_size, q_dim));
    if (c.attention_bias) {
      BATON_ASSIGN_OR_RETURN(t, get(name("attn_q.bias")));
      BATON_ASSIGN_OR_RETURN(w.bq, Vector(t, q_dim));
      BATON_ASSIGN_OR_RETURN(t, get(name("attn_k.bias")));
      BATON_ASSIGN_OR_RETURN(w.bk, Vector(t, c.kv_dim()));
      BATON_ASSIGN_OR_RETURN(t, get(name("attn_v.bias")));
      BATON_ASSIGN_OR_RETURN(w.bv, Vector(t, c.kv_dim()));
    }
    BATON_ASSIGN_OR_RETURN(t, get(name("ffn_norm.weight")));
    BATON_ASSIGN_OR_RETURN(w.ffn_norm, Vector(t, c.hidden_size));
    BATON_ASSIGN_OR_RETURN(t, get(name("ffn_gate.weight")));
    BATON_ASSIGN_OR_RETURN(w.w_gate,
                           Matrix(t, c.intermediate_size, c.hidden_size));
    BATON_ASSIGN_OR_RETURN(t, get(name("ffn_up.weight")));
    BATON_ASSIGN_OR_RETURN(w.w_up,
                           Matrix(t, c.intermediate_size, c.hidden_size));
    BATON_ASSIGN_OR_RETURN(t, get(name("ffn_down.weight")));
    BATON_ASSIGN_OR_RETURN(w.w_down,
                           Matrix(t, c.hidden_size, c.intermediate_size));
    layers_.push_back(w);
  }
  return absl::OkStatus();
}

absl::Status ModelWeights::LoadSafetensors(const std::string& path) {
  BATON_ASSIGN_OR_RETURN(safetensors_, SafetensorsModel::Open(path));
  hf_directory_ = safetensors_->directory();
  BATON_ASSIGN_OR_RETURN(
      config_, ModelConfigFromHfConfigFile(safetensors_->config_json_path()));
  const ModelConfig& c = config_;
  auto get = [&](const std::string& name) {
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
  const int64_t q_dim = c.num_heads * c.head_dim;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    auto name = [&](const char* suffix) {
      return absl::StrCat("model.layers.", l, ".", suffix);
    };
    LayerWeights w;
    BATON_ASSIGN_OR_RETURN(TensorView t, get(name("input_layernorm.weight")));
    BATON_ASSIGN_OR_RETURN(w.attn_norm, Vector(t, c.hidden_size));
    BATON_ASSIGN_OR_RETURN(t, get(name("self_attn.q_proj.weight")));
    BATON_ASSIGN_OR_RETURN(w.wq, Matrix(t, q_dim, c.hidden_size));
    BATON_ASSIGN_OR_RETURN(t, get(name("self_attn.k_proj.weight")));
    BATON_ASSIGN_OR_RETURN(w.wk, Matrix(t, c.kv_dim(), c.hidden_size));
    BATON_ASSIGN_OR_RETURN(t, get(name("self_attn.v_proj.weight")));
    BATON_ASSIGN_OR_RETURN(w.wv, Matrix(t, c.kv_dim(), c.hidden_size));
    BATON_ASSIGN_OR_RETURN(t, get(name("self_attn.o_proj.weight")));
    BATON_ASSIGN_OR_RETURN(w.wo, Matrix(t, c.hidden_size, q_dim));
    if (c.attention_bias) {
      BATON_ASSIGN_OR_RETURN(t, get(name("self_attn.q_proj.bias")));
      BATON_ASSIGN_OR_RETURN(w.bq, Vector(t, q_dim));
      BATON_ASSIGN_OR_RETURN(t, get(name("self_attn.k_proj.bias")));
      BATON_ASSIGN_OR_RETURN(w.bk, Vector(t, c.kv_dim()));
      BATON_ASSIGN_OR_RETURN(t, get(name("self_attn.v_proj.bias")));
      BATON_ASSIGN_OR_RETURN(w.bv, Vector(t, c.kv_dim()));
    }
    BATON_ASSIGN_OR_RETURN(t, get(name("post_attention_layernorm.weight")));
    BATON_ASSIGN_OR_RETURN(w.ffn_norm, Vector(t, c.hidden_size));
    BATON_ASSIGN_OR_RETURN(t, get(name("mlp.gate_proj.weight")));
    BATON_ASSIGN_OR_RETURN(w.w_gate,
                           Matrix(t, c.intermediate_size, c.hidden_size));
    BATON_ASSIGN_OR_RETURN(t, get(name("mlp.up_proj.weight")));
    BATON_ASSIGN_OR_RETURN(w.w_up,
                           Matrix(t, c.intermediate_size, c.hidden_size));
    BATON_ASSIGN_OR_RETURN(t, get(name("mlp.down_proj.weight")));
    BATON_ASSIGN_OR_RETURN(w.w_down,
                           Matrix(t, c.hidden_size, c.intermediate_size));
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
