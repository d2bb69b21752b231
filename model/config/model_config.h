// The architecture hyper-parameters of a Llama-family model (Llama 2/3,
// SmolLM/SmolLM2, Qwen2), read from GGUF metadata or an HF config.json.
#ifndef BATON_MODEL_CONFIG_MODEL_CONFIG_H_
#define BATON_MODEL_CONFIG_MODEL_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/gguf/gguf_file.h"

namespace baton {

// How RoPE pairs the dimensions of a head it rotates.
enum class RopeStyle {
  // Adjacent pairs (x[2i], x[2i+1]): GGUF "llama" files, whose Q/K weights
  // were permuted at conversion.
  kInterleaved,
  // Halves (x[i], x[i + d/2]): HF checkpoints, and GGUF qwen2 files.
  kHalfSplit,
};
absl::string_view RopeStyleName(RopeStyle style);

enum class RopeScalingType { kNone, kLinear, kLlama3, kYarn };
absl::string_view RopeScalingTypeName(RopeScalingType type);

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;
  int64_t original_context_length = 0;  // llama3 / yarn
  double low_freq_factor = 1.0;         // llama3
  double high_freq_factor = 4.0;        // llama3
};

struct ModelConfig {
  std::string architecture;  // "llama", "qwen2"
  std::string name;          // free text from the file, may be empty

  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // SwiGLU inner width
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // == num_heads without GQA
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t context_length = 0;

  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  int64_t rope_dim =
      0;  // rotated dimensions per head (== head_dim unless partial)
  RopeStyle rope_style = RopeStyle::kInterleaved;
  RopeScaling rope_scaling;
  // GGUF Llama-3.1+ files carry precomputed per-dimension frequency factors
  // in the tensor "rope_freqs.weight" instead of rope_scaling.
  bool has_rope_freqs_tensor = false;

  bool tie_word_embeddings = false;  // no separate output projection
  bool attention_bias = false;       // Q/K/V projections have biases (Qwen2)

  // Q heads per KV head.
  int64_t gqa_group() const { return num_heads / num_kv_heads; }
  // Elements of K (or V) per token per layer.
  int64_t kv_dim() const { return num_kv_heads * head_dim; }

  // InvalidArgument naming the first inconsistent field.
  absl::Status Validate() const;
  // Multi-line "key: value" summary.
  std::string DebugString() const;
};

// From GGUF metadata ("general.architecture" and "<arch>.*" keys) plus the
// tensor list (tied embeddings, biases, rope_freqs).
absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& gguf);

// From the text of an HF config.json ("model_type" llama, qwen2 or mistral).
absl::StatusOr<ModelConfig> ModelConfigFromHfJson(absl::string_view json_text);

// Reads and parses `path` (a config.json).
absl::StatusOr<ModelConfig> ModelConfigFromHfConfigFile(
    const std::string& path);

}  // namespace baton

#endif  // BATON_MODEL_CONFIG_MODEL_CONFIG_H_
