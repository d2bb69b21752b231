// Byte-level BPE tokenizer (GPT-2, SmolLM2, Llama-3, Qwen2 families), loaded
// from a GGUF file's tokenizer.* metadata or from a HF tokenizer.json, and
// matched id-for-id against llama.cpp and HF tokenizers.
//
// Encode pipeline:
//   1. (parse_special) special and user-defined tokens are found in the raw
//      text, longest text first, and cut out as single tokens; user-defined
//      tokens are always cut out.
//   2. Each remaining fragment is decoded leniently: every byte that does not
//      start a well-formed UTF-8 sequence becomes U+FFFD (as llama.cpp does;
//      overlong forms and surrogates decode by bit pattern, see utf8.h).
//   3. The PreTokenizer's regexes split the fragment into pieces.
//   4. Each piece's UTF-8 bytes are BPE-encoded.
//
// Decode concatenates each token's bytes: byte-level tokens map back to raw
// bytes, special and user-defined tokens give their text. The result may be
// invalid UTF-8 (a character split across a token boundary at the end, or
// byte tokens); IncrementalDecoder yields only complete characters.
#ifndef BATON_MODEL_TOKENIZER_TOKENIZER_H_
#define BATON_MODEL_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/gguf/gguf_file.h"
#include "model/tokenizer/token_types.h"

namespace baton {

class BpeModel;
class PreTokenizer;
struct TokenizerSpec;

struct EncodeOptions {
  // Prepend BOS; unset: as the model's metadata says (GGUF
  // tokenizer.ggml.add_bos_token, tokenizer_config.json add_bos_token or the
  // post-processor template).
  std::optional<bool> add_bos;
  // Append EOS; unset: as the model's metadata says.
  std::optional<bool> add_eos;
  // Recognise special (control) tokens written in the text, e.g. the
  // "<|im_start|>" of a rendered chat template. False treats them as plain
  // text (use for untrusted user content that is encoded on its own).
  bool parse_special = true;
};

class Tokenizer {
 public:
  // From the tokenizer.* keys of a GGUF file. Supports tokenizer.ggml.model
  // "gpt2" (byte-level BPE); any other model type is Unimplemented naming it.
  // Known tokenizer.ggml.pre values pick the model's regexes; an unknown one
  // falls back to the GPT-2 regex and records a line in notes().
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(
      const GgufFile& gguf);

  // From a HF tokenizer.json (model.type "BPE"; pre_tokenizer ByteLevel,
  // Split, Digits or a Sequence of them; decoder ByteLevel). Unsupported
  // components are Unimplemented naming them. A tokenizer_config.json beside
  // it, if present, supplies bos/eos tokens, add_bos_token and the chat
  // template.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromHfJson(
      const std::string& tokenizer_json_path);
  // The same from in-memory JSON texts; `config_json` may be empty.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromHfJsonText(
      absl::string_view tokenizer_json, absl::string_view config_json);

  // Built by the loaders; see tokenizer_spec.h.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(TokenizerSpec spec);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Any bytes are accepted (see the pipeline above). Thread-safe.
  std::vector<int32_t> Encode(absl::string_view text,
                              const EncodeOptions& options = {}) const;

  // Concatenated token bytes. skip_special drops special (control/unknown)
  // tokens. Ids outside [0, vocab_size()) and unused tokens contribute
  // nothing; callers that take ids from outside must check IsValidId first.
  std::string Decode(std::span<const int32_t> ids,
                     bool skip_special = false) const;

  // The bytes that token `id` stands for ("" for an invalid id).
  const std::string& TokenToBytes(int32_t id) const;
  // The token's text as stored in the vocabulary (byte-level alphabet for
  // normal tokens).
  const std::string& TokenText(int32_t id) const;
  TokenType token_type(int32_t id) const;

  int32_t vocab_size() const { return static_cast<int32_t>(texts_.size()); }
  bool IsValidId(int32_t id) const { return id >= 0 && id < vocab_size(); }
  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  bool add_bos_default() const { return add_bos_; }
  bool add_eos_default() const { return add_eos_; }

  // EOS, EOT, EOM and the special tokens that end a turn by name
  // (<|im_end|>, <|eot_id|>, <|endoftext|>, <|end_of_text|>, <|eom_id|>,
  // <end_of_turn>, <|end|>, </s>) when present.
  bool IsEndOfGeneration(int32_t id) const;
  const std::vector<int32_t>& end_of_generation_ids() const { return eog_ids_; }
  // Control and unknown tokens.
  bool IsSpecial(int32_t id) const;
  // The token whose vocabulary text is exactly `text`, if any.
  std::optional<int32_t> FindToken(absl::string_view text) const;

  // Jinja source of the model's chat template ("" if it has none).
  const std::string& chat_template_source() const { return chat_template_; }
  // How the pre-tokenizer was chosen, e.g. "gguf pre 'smollm'".
  const std::string& pre_tokenizer_name() const { return pre_name_; }
  // Anything the loader decided that a user may want to know about (e.g. an
  // unknown pre-tokenizer replaced by GPT-2's regex).
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  struct SpecialText {
    std::string text;
    int32_t id;
    bool lstrip;
    bool rstrip;
    bool control;  // matched only when parse_special
  };
  struct Fragment;
  Tokenizer();
  void Partition(absl::string_view text, bool parse_special,
                 std::vector<Fragment>* fragments) const;

  std::vector<std::string> texts_;
  std::vector<std::string> bytes_;
  std::vector<TokenType> types_;
  std::vector<SpecialText> specials_;  // longest text first
  std::unique_ptr<PreTokenizer> pre_;
  std::unique_ptr<BpeModel> bpe_;
  std::optional<int32_t> bos_id_;
  std::optional<int32_t> eos_id_;
  bool add_bos_ = false;
  bool add_eos_ = false;
  std::vector<int32_t> eog_ids_;  // sorted
  std::string chat_template_;
  std::string pre_name_;
  std::vector<std::string> notes_;
  std::unordered_map<std::string, int32_t> text_to_id_;
};

}  // namespace baton

#endif  // BATON_MODEL_TOKENIZER_TOKENIZER_H_
