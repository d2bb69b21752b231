// A self-contained byte-level BPE vocabulary (GGUF "gpt2" tokenizer) of any
// size: control tokens (the style's specials), the 256 GPT-2 byte symbols,
// and normal tokens made by merges of lowercase letters ("Ġa", "ab", "Ġab",
// "abc", "Ġabc", "abcd", ...) filling the rest. Filling with merges rather
// than reserved control tokens keeps the special-token count (which costs
// special-token scanning in tokenizers) as in the real model, and random
// weights then generate printable text.
#ifndef BATON_MODEL_SYNTH_SYNTH_VOCAB_H_
#define BATON_MODEL_SYNTH_SYNTH_VOCAB_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/synth/shapes.h"

namespace baton {

// llama.cpp's token types (tokenizer.ggml.token_type).
inline constexpr int32_t kSynthTokenNormal = 1;
inline constexpr int32_t kSynthTokenControl = 3;

struct SynthVocab {
  std::vector<std::string> tokens;   // UTF-8, byte-level (space is "Ġ")
  std::vector<int32_t> token_types;  // kSynthTokenNormal / kSynthTokenControl
  std::vector<std::string> merges;   // "left right", by rank
  std::string pre;                   // tokenizer.ggml.pre
  std::string chat_template;         // Jinja
  int64_t bos_id = -1;
  int64_t eos_id = -1;
  int64_t unknown_id = -1;  // -1: none
  int64_t padding_id = -1;  // -1: none
  bool add_bos = false;
};

// The GPT-2 byte-level symbol (UTF-8) that stands for `byte`.
std::string ByteLevelSymbol(uint8_t byte);

// Exactly `vocab_size` tokens, vocab_size - specials - 256 merges;
// InvalidArgument if it cannot hold the special tokens and the 256 byte
// symbols.
absl::StatusOr<SynthVocab> BuildSynthVocab(SynthTokenizerStyle style,
                                           int64_t vocab_size);

}  // namespace baton

#endif  // BATON_MODEL_SYNTH_SYNTH_VOCAB_H_
