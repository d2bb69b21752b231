// Everything a Tokenizer is built from, as the GGUF and tokenizer.json loaders
// produce it. Internal to model/tokenizer.
#ifndef BATON_MODEL_TOKENIZER_TOKENIZER_SPEC_H_
#define BATON_MODEL_TOKENIZER_TOKENIZER_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/tokenizer/bpe.h"
#include "model/tokenizer/pre_tokenizer.h"
#include "model/tokenizer/token_types.h"

namespace baton {

struct TokenizerSpec {
  // Per token id: vocabulary text (byte-level alphabet for normal tokens, the
  // literal text for the others), its type, and whether a special/added token
  // swallows whitespace on its left/right when matched.
  std::vector<std::string> texts;
  std::vector<TokenType> types;
  std::vector<bool> lstrip;  // empty: all false
  std::vector<bool> rstrip;  // empty: all false
  // Merge pairs in byte-level text, rank = index.
  std::vector<std::pair<std::string, std::string>> merges;
  BpeOptions bpe;
  std::vector<PreTokenizerStep> pre_steps;
  std::string pre_name;
  std::optional<int32_t> bos_id;
  std::optional<int32_t> eos_id;
  std::vector<int32_t> extra_eog_ids;  // EOT, EOM
  bool add_bos = false;
  bool add_eos = false;
  std::string chat_template;
  std::vector<std::string> notes;
};

}  // namespace baton

#endif  // BATON_MODEL_TOKENIZER_TOKENIZER_SPEC_H_
