#include "model/synth/shapes.h"

#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace baton {
namespace {

std::vector<SynthShape> MakeShapes() {
  std::vector<SynthShape> shapes;
  {
    // Two layers of a small model: fast end-to-end tests.
    SynthShape s;
    s.name = "tiny";
    s.display_name = "Synthetic Tiny Llama";
    s.num_layers = 2;
    s.hidden_size = 128;
    s.intermediate_size = 384;
    s.num_heads = 4;
    s.num_kv_heads = 2;
    s.head_dim = 32;
    s.vocab_size = 2048;
    s.context_length = 2048;
    s.rope_theta = 10000.0f;
    s.tie_word_embeddings = true;
    s.tokenizer = SynthTokenizerStyle::kSmolLM;
    shapes.push_back(s);
  }
  {
    SynthShape s;
    s.name = "smollm2-135m";
    s.display_name = "Synthetic SmolLM2 135M";
    s.num_layers = 30;
    s.hidden_size = 576;
    s.intermediate_size = 1536;
    s.num_heads = 9;
    s.num_kv_heads = 3;
    s.head_dim = 64;
    s.vocab_size = 49152;
    s.context_length = 8192;
    s.rope_theta = 100000.0f;
    s.tie_word_embeddings = true;
    s.tokenizer = SynthTokenizerStyle::kSmolLM;
    shapes.push_back(s);
  }
  {
    SynthShape s;
    s.name = "llama-3.2-1b";
    s.display_name = "Synthetic Llama 3.2 1B";
    s.num_layers = 16;
    s.hidden_size = 2048;
    s.intermediate_size = 8192;
    s.num_heads = 32;
    s.num_kv_heads = 8;
    s.head_dim = 64;
    s.vocab_size = 128256;
    s.context_length = 131072;
    s.rope_theta = 500000.0f;
    s.tie_word_embeddings = true;
    s.write_head_dim_keys = true;
    s.rope_scaling_factor = 32.0f;
    s.rope_low_freq_factor = 1.0f;
    s.rope_high_freq_factor = 4.0f;
    s.rope_original_context_length = 8192;
    s.tokenizer = SynthTokenizerStyle::kLlama3;
    shapes.push_back(s);
  }
  {
    SynthShape s;
    s.name = "llama-3-8b";
    s.display_name = "Synthetic Llama 3 8B";
    s.num_layers = 32;
    s.hidden_size = 4096;
    s.intermediate_size = 14336;
    s.num_heads = 32;
    s.num_kv_heads = 8;
    s.head_dim = 128;
    s.vocab_size = 128256;
    s.context_length = 8192;
    s.rope_theta = 500000.0f;
    s.tie_word_embeddings = false;
    s.tokenizer = SynthTokenizerStyle::kLlama3;
    shapes.push_back(s);
  }
  return shapes;
}

}  // namespace

const std::vector<SynthShape>& SynthShapes() {
  static const auto* shapes = new std::vector<SynthShape>(MakeShapes());
  return *shapes;
}

std::string SynthShapeNames() {
  std::vector<std::string> names;
  for (const SynthShape& s : SynthShapes()) names.push_back(s.name);
  return absl::StrJoin(names, ", ");
}

absl::StatusOr<SynthShape> FindSynthShape(absl::string_view name) {
  for (const SynthShape& s : SynthShapes()) {
    if (s.name == name) return s;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown shape '", name, "'; valid shapes: ", SynthShapeNames()));
}

std::vector<float> SynthRopeFreqFactors(const SynthShape& shape) {
  std::vector<float> factors;
  if (shape.rope_scaling_factor <= 0.0f) return factors;
  const double old_ctx =
      static_cast<double>(shape.rope_original_context_length);
  const double low_wavelen = old_ctx / shape.rope_low_freq_factor;
  const double high_wavelen = old_ctx / shape.rope_high_freq_factor;
  const double factor = shape.rope_scaling_factor;
  for (int64_t i = 0; i < shape.head_dim / 2; ++i) {
    double freq = 1.0 / std::pow(static_cast<double>(shape.rope_theta),
                                 2.0 * i / shape.head_dim);
    double wavelen = 2.0 * std::numbers::pi / freq;
    double f;
    if (wavelen < high_wavelen) {
      f = 1.0;
    } else if (wavelen > low_wavelen) {
      f = factor;
    } else {
      double smooth =
          (old_ctx / wavelen - shape.rope_low_freq_factor) /
          (shape.rope_high_freq_factor - shape.rope_low_freq_factor);
      f = 1.0 / ((1.0 - smooth) / factor + smooth);
    }
    factors.push_back(static_cast<float>(f));
  }
  return factors;
}

}  // namespace baton
