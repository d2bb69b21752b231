// Named model shapes `baton synth` can generate: the hyper-parameters of real
// Llama-architecture checkpoints, without their weights.
#ifndef BATON_MODEL_SYNTH_SHAPES_H_
#define BATON_MODEL_SYNTH_SHAPES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton {

// Which special tokens, pre-tokenizer and chat template the vocabulary gets.
enum class SynthTokenizerStyle {
  // <|endoftext|> <|im_start|> <|im_end|> at ids 0..2, ChatML, pre "smollm".
  kSmolLM,
  // The last 256 ids are Llama 3 specials (<|begin_of_text|>, <|eot_id|>,
  // ...), pre "llama-bpe".
  kLlama3,
};

struct SynthShape {
  std::string name;          // e.g. "llama-3.2-1b"
  std::string display_name;  // general.name, e.g. "Synthetic Llama 3.2 1B"
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t context_length = 0;
  float rope_theta = 10000.0f;
  float rms_norm_eps = 1e-5f;
  bool tie_word_embeddings = true;
  // Writes llama.attention.key_length / value_length (as converters do when
  // the checkpoint's config names head_dim).
  bool write_head_dim_keys = false;
  // Llama 3 rope scaling, stored as the F32 tensor rope_freqs.weight of
  // head_dim / 2 per-frequency factors; 0 = no scaling, no tensor.
  float rope_scaling_factor = 0.0f;
  float rope_low_freq_factor = 1.0f;
  float rope_high_freq_factor = 4.0f;
  int64_t rope_original_context_length = 8192;
  SynthTokenizerStyle tokenizer = SynthTokenizerStyle::kSmolLM;
};

// Every known shape, smallest first.
const std::vector<SynthShape>& SynthShapes();
// "tiny, smollm2-135m, llama-3.2-1b, llama-3-8b".
std::string SynthShapeNames();
// InvalidArgument listing the valid names for an unknown one.
absl::StatusOr<SynthShape> FindSynthShape(absl::string_view name);

// The rope_freqs.weight values of a shape with rope_scaling_factor > 0:
// head_dim / 2 wavelength multipliers (1 for high frequencies, the factor
// for low ones, a smooth blend between).
std::vector<float> SynthRopeFreqFactors(const SynthShape& shape);

}  // namespace baton

#endif  // BATON_MODEL_SYNTH_SHAPES_H_
