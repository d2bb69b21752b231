#include "model/config/model_config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace baton {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat("model config: ", field, " ", problem));
}

}  // namespace

absl::string_view RopeStyleName(RopeStyle style) {
  return style == RopeStyle::kInterleaved ? "interleaved pairs (GGUF)"
                                          : "half split (HF)";
}

absl::string_view RopeScalingTypeName(RopeScalingType type) {
  switch (type) {
    case RopeScalingType::kNone:
      return "none";
    case RopeScalingType::kLinear:
      return "linear";
    case RopeScalingType::kLlama3:
      return "llama3";
    case RopeScalingType::kYarn:
      return "yarn";
  }
  return "unknown";
}

absl::Status ModelConfig::Validate() const {
  struct Positive {
    const char* name;
    int64_t value;
  };
  for (const Positive& p :
       {Positive{"num_layers", num_layers},
        Positive{"hidden_size", hidden_size},
        Positive{"intermediate_size", intermediate_size},
        Positive{"num_heads", num_heads},
        Positive{"num_kv_heads", num_kv_heads}, Positive{"head_dim", head_dim},
        Positive{"vocab_size", vocab_size},
        Positive{"context_length", context_length}}) {
    if (p.value <= 0) {
      return Invalid(p.name, absl::StrCat("must be > 0, got ", p.value));
    }
  }
  if (num_heads % num_kv_heads != 0) {
    return Invalid("num_heads", absl::StrCat("(", num_heads,
                                             ") must be a multiple of "
                                             "num_kv_heads (",
                                             num_kv_heads, ")"));
  }
  if (head_dim % 2 != 0) {
    return Invalid("head_dim", absl::StrCat("must be even, got ", head_dim));
  }
  if (rope_dim <= 0 || rope_dim > head_dim || rope_dim % 2 != 0) {
    return Invalid("rope_dim", absl::StrCat("must be even and in (0, head_dim=",
                                            head_dim, "], got ", rope_dim));
  }
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps)) {
    return Invalid("rms_norm_eps",
                   absl::StrCat("must be > 0, got ", rms_norm_eps));
  }
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) {
    return Invalid("rope_theta", absl::StrCat("must be > 0, got ", rope_theta));
  }
  if (rope_scaling.type != RopeScalingType::kNone &&
      (!(rope_scaling.factor > 0) || !std::isfinite(rope_scaling.factor))) {
    return Invalid("rope_scaling.factor",
                   absl::StrCat("must be > 0, got ", rope_scaling.factor));
  }
  return absl::OkStatus();
}

std::string ModelConfig::DebugString() const {
  std::string out;
  absl::StrAppendFormat(&out, "architecture:        %s\n", architecture);
  if (!name.empty())
    absl::StrAppendFormat(&out, "name:                %s\n", name);
  absl::StrAppendFormat(&out, "layers:              %d\n", num_layers);
  absl::StrAppendFormat(&out, "hidden size:         %d\n", hidden_size);
  absl::StrAppendFormat(&out, "ffn size:            %d\n", intermediate_size);
  absl::StrAppendFormat(&out,
                        "heads:               %d (kv heads %d, group %d)\n",
                        num_heads, num_kv_heads, gqa_group());
  absl::StrAppendFormat(&out, "head dim:            %d\n", head_dim);
  absl::StrAppendFormat(&out, "vocab size:          %d\n", vocab_size);
  absl::StrAppendFormat(&out, "context length:      %d\n", context_length);
  absl::StrAppendFormat(&out, "rms norm eps:        %g\n", rms_norm_eps);
  absl::StrAppendFormat(&out, "rope theta:          %g\n", rope_theta);
  absl::StrAppendFormat(&out, "rope dims:           %d, %s\n", rope_dim,
                        RopeStyleName(rope_style));
  absl::StrAppendFormat(&out, "rope scaling:        %s",
                        RopeScalingTypeName(rope_scaling.type));
  if (rope_scaling.type != RopeScalingType::kNone) {
    absl::StrAppendFormat(&out, " (factor %g, original context %d)",
                          rope_scaling.factor,
                          rope_scaling.original_context_length);
  }
  if (has_rope_freqs_tensor) absl::StrAppend(&out, " + rope_freqs tensor");
  absl::StrAppend(&out, "\n");
  absl::StrAppendFormat(&out, "tied embeddings:     %s\n",
                        tie_word_embeddings ? "yes" : "no");
  absl::StrAppendFormat(&out, "attention bias:      %s\n",
                        attention_bias ? "yes" : "no");
  return out;
}

absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& gguf) {
  ModelConfig c;
  BATON_ASSIGN_OR_RETURN(absl::string_view arch,
                         gguf.GetString("general.architecture"));
  c.architecture = std::string(arch);
  if (c.architecture != "llama" && c.architecture != "qwen2") {
    return absl::UnimplementedError(
        absl::StrCat("GGUF architecture '", c.architecture,
                     "' is not supported (supported: llama, qwen2)"));
  }
  if (gguf.Find("general.name") != nullptr) {
    BATON_ASSIGN_OR_RETURN(absl::string_view name,
                           gguf.GetString("general.name"));
    c.name = std::string(name);
  }
  auto key = [&](absl::string_view k) { return absl::StrCat(arch, ".", k); };
  BATON_ASSIGN_OR_RETURN(c.num_layers, gguf.GetInt(key("block_count")));
  BATON_ASSIGN_OR_RETURN(c.hidden_size, gguf.GetInt(key("embedding_length")));
  BATON_ASSIGN_OR_RETURN(c.intermediate_size,
                         gguf.GetInt(key("feed_forward_length")));
  BATON_ASSIGN_OR_RETURN(c.num_heads, gguf.GetInt(key("attention.head_count")));
  BATON_ASSIGN_OR_RETURN(
      c.num_kv_heads,
      gguf.GetIntOr(key("attention.head_count_kv"), c.num_heads));
  BATON_ASSIGN_OR_RETURN(c.context_length, gguf.GetInt(key("context_length")));
  BATON_ASSIGN_OR_RETURN(
      c.rms_norm_eps, gguf.GetFloat(key("attention.layer_norm_rms_epsilon")));
  BATON_ASSIGN_OR_RETURN(c.rope_theta,
                         gguf.GetFloatOr(key("rope.freq_base"), 10000.0));
  if (c.num_heads <= 0) return Invalid("num_heads", "must be > 0");
  BATON_ASSIGN_OR_RETURN(
      c.head_dim,
      gguf.GetIntOr(key("attention.key_length"), c.hidden_size / c.num_heads));
  BATON_ASSIGN_OR_RETURN(
      c.rope_dim, gguf.GetIntOr(key("rope.dimension_count"), c.head_dim));
  if (gguf.Find(key("vocab_size")) != nullptr) {
    BATON_ASSIGN_OR_RETURN(c.vocab_size, gguf.GetInt(key("vocab_size")));
  } else {
    BATON_ASSIGN_OR_RETURN(
        const GgufArray* tokens,
        gguf.GetArray("tokenizer.ggml.tokens", GgufType::kString));
    c.vocab_size = static_cast<int64_t>(tokens->size());
  }
  c.rope_style = c.architecture == "qwen2" ? RopeStyle::kHalfSplit
                                           : RopeStyle::kInterleaved;
  if (gguf.Find(key("rope.scaling.type")) != nullptr) {
    BATON_ASSIGN_OR_RETURN(absl::string_view type,
                           gguf.GetString(key("rope.scaling.type")));
    if (type == "linear") {
      c.rope_scaling.type = RopeScalingType::kLinear;
    } else if (type == "yarn") {
      c.rope_scaling.type = RopeScalingType::kYarn;
    } else if (type != "none") {
      return absl::UnimplementedError(
          absl::StrCat("GGUF rope scaling type '", type, "' is not supported"));
    }
    if (c.rope_scaling.type != RopeScalingType::kNone) {
      BATON_ASSIGN_OR_RETURN(c.rope_scaling.factor,
                             gguf.GetFloat(key("rope.scaling.factor")));
      BATON_ASSIGN_OR_RETURN(
          c.rope_scaling.original_context_length,
          gguf.GetIntOr(key("rope.scaling.original_context_length"), 0));
    }
  }
  c.has_rope_freqs_tensor = gguf.FindTensor("rope_freqs.weight") != nullptr;
  c.tie_word_embeddings = gguf.FindTensor("output.weight") == nullptr;
  c.attention_bias = gguf.FindTensor("blk.0.attn_q.bias") != nullptr;
  BATON_RETURN_IF_ERROR(c.Validate());
  return c;
}

namespace {

using Json = nlohmann::json;

absl::StatusOr<int64_t> JsonInt(const Json& j, const char* field,
                                std::optional<int64_t> fallback = {}) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) {
    if (fallback) return *fallback;
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: missing field '", field, "'"));
  }
  if (!it->is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: field '", field,
                     "' must be an integer, got ", it->dump()));
  }
  return it->get<int64_t>();
}

absl::StatusOr<double> JsonFloat(const Json& j, const char* field,
                                 std::optional<double> fallback = {}) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) {
    if (fallback) return *fallback;
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: missing field '", field, "'"));
  }
  if (!it->is_number()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: field '", field, "' must be a number, got ", it->dump()));
  }
  return it->get<double>();
}

absl::StatusOr<bool> JsonBool(const Json& j, const char* field, bool fallback) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: field '", field, "' must be a bool, got ", it->dump()));
  }
  return it->get<bool>();
}

absl::Status ParseRopeScaling(const Json& j, RopeScaling& out) {
  auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) {
    return absl::InvalidArgumentError(
        "config.json: 'rope_scaling' must be an object or null");
  }
  const Json& rs = *it;
  std::string type;
  for (const char* field : {"rope_type", "type"}) {
    auto t = rs.find(field);
    if (t != rs.end() && t->is_string()) {
      type = t->get<std::string>();
      break;
    }
  }
  if (type == "default" || type.empty()) return absl::OkStatus();
  if (type == "linear") {
    out.type = RopeScalingType::kLinear;
  } else if (type == "llama3") {
    out.type = RopeScalingType::kLlama3;
  } else if (type == "yarn") {
    out.type = RopeScalingType::kYarn;
  } else {
    return absl::UnimplementedError(absl::StrCat(
        "config.json: rope_scaling type '", type, "' is not supported"));
  }
  BATON_ASSIGN_OR_RETURN(out.factor, JsonFloat(rs, "factor"));
  BATON_ASSIGN_OR_RETURN(out.original_context_length,
                         JsonInt(rs, "original_max_position_embeddings", 0));
  BATON_ASSIGN_OR_RETURN(out.low_freq_factor,
                         JsonFloat(rs, "low_freq_factor", 1.0));
  BATON_ASSIGN_OR_RETURN(out.high_freq_factor,
                         JsonFloat(rs, "high_freq_factor", 4.0));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfigFromHfJson(absl::string_view json_text) {
  Json j = Json::parse(json_text.begin(), json_text.end(), nullptr,
                       /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError("config.json: malformed JSON");
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        "config.json: top level must be an object");
  }
  auto mt = j.find("model_type");
  if (mt == j.end() || !mt->is_string()) {
    return absl::InvalidArgumentError(
        "config.json: missing string field 'model_type'");
  }
  ModelConfig c;
  std::string model_type = mt->get<std::string>();
  if (model_type == "llama" || model_type == "mistral") {
    c.architecture = "llama";
  } else if (model_type == "qwen2") {
    c.architecture = "qwen2";
  } else {
    return absl::UnimplementedError(
        absl::StrCat("config.json: model_type '", model_type,
                     "' is not supported (supported: llama, mistral, qwen2)"));
  }
  if (auto n = j.find("_name_or_path"); n != j.end() && n->is_string()) {
    c.name = n->get<std::string>();
  }
  BATON_ASSIGN_OR_RETURN(c.num_layers, JsonInt(j, "num_hidden_layers"));
  BATON_ASSIGN_OR_RETURN(c.hidden_size, JsonInt(j, "hidden_size"));
  BATON_ASSIGN_OR_RETURN(c.intermediate_size, JsonInt(j, "intermediate_size"));
  BATON_ASSIGN_OR_RETURN(c.num_heads, JsonInt(j, "num_attention_heads"));
  BATON_ASSIGN_OR_RETURN(c.num_kv_heads,
                         JsonInt(j, "num_key_value_heads", c.num_heads));
  if (c.num_heads <= 0) return Invalid("num_heads", "must be > 0");
  BATON_ASSIGN_OR_RETURN(c.head_dim,
                         JsonInt(j, "head_dim", c.hidden_size / c.num_heads));
  c.rope_dim = c.head_dim;
  BATON_ASSIGN_OR_RETURN(c.vocab_size, JsonInt(j, "vocab_size"));
  BATON_ASSIGN_OR_RETURN(c.context_length,
                         JsonInt(j, "max_position_embeddings"));
  BATON_ASSIGN_OR_RETURN(c.rms_norm_eps, JsonFloat(j, "rms_norm_eps", 1e-6));
  BATON_ASSIGN_OR_RETURN(c.rope_theta, JsonFloat(j, "rope_theta", 10000.0));
  BATON_ASSIGN_OR_RETURN(c.tie_word_embeddings,
                         JsonBool(j, "tie_word_embeddings", false));
  BATON_ASSIGN_OR_RETURN(
      c.attention_bias,
      JsonBool(j, "attention_bias", /*fallback=*/c.architecture == "qwen2"));
  c.rope_style = RopeStyle::kHalfSplit;
  BATON_RETURN_IF_ERROR(ParseRopeScaling(j, c.rope_scaling));
  BATON_RETURN_IF_ERROR(c.Validate());
  return c;
}

absl::StatusOr<ModelConfig> ModelConfigFromHfConfigFile(
    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  auto config = ModelConfigFromHfJson(buffer.str());
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

}  // namespace baton
