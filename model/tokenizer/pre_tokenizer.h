// Regex pre-tokenization: splits text into the pieces that BPE encodes one by
// one. A PreTokenizer is a sequence of steps; each step runs one regex over
// every piece the previous steps produced and splits it further. The regex
// only sees the piece it splits (a lookahead stops at the piece's end), as in
// llama.cpp and HF tokenizers.
//
// Regexes are PCRE2 with PCRE2_UTF | PCRE2_UCP (\s, \p{L}, \p{N} are
// Unicode-aware), JIT-compiled when the library supports it.
//
// Input bytes are decoded leniently (model/tokenizer/utf8.h DecodeLenient):
// every byte that does not start a well-formed sequence becomes U+FFFD, which
// is what goes into BPE. Codepoints that PCRE2 cannot represent (surrogates
// and values above U+10FFFF, which lenient decoding lets through from
// overlong-style sequences) are matched as U+FFFD / U+F0000 (same regex
// classes) and re-encoded with their own value. U+180E, which PCRE2 counts
// as \s but Unicode's White_Space (llama.cpp, Rust, Oniguruma) does not, is
// matched as U+200B (same category Cf).
#ifndef BATON_MODEL_TOKENIZER_PRE_TOKENIZER_H_
#define BATON_MODEL_TOKENIZER_PRE_TOKENIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton {

// Regexes of the pre-tokenizers that models ship with (tokenizer.json form).
inline constexpr absl::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr absl::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr absl::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr absl::string_view kSingleDigitPattern = R"(\p{N})";
inline constexpr absl::string_view kDigitRunPattern = R"(\p{N}+)";

// What a step does with the text its regex matches (HF SplitDelimiterBehavior).
enum class SplitBehavior {
  kIsolated,  // matches and the text between them become separate pieces
  kRemoved,   // matches are dropped; the text between them stays
};

struct PreTokenizerStep {
  std::string pattern;   // PCRE2 syntax
  bool literal = false;  // pattern is a plain string
  SplitBehavior behavior = SplitBehavior::kIsolated;
};

class PreTokenizer {
 public:
  // InvalidArgument naming the pattern and PCRE2's message if one does not
  // compile.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> Create(
      std::vector<PreTokenizerStep> steps);
  ~PreTokenizer();

  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Appends the pieces of `text` (any bytes) to `pieces`, each as UTF-8 bytes
  // (invalid input bytes as U+FFFD). No piece is empty. Thread-safe.
  void Split(absl::string_view text, std::vector<std::string>* pieces) const;

  const std::vector<PreTokenizerStep>& steps() const { return steps_; }

 private:
  struct Compiled;
  PreTokenizer() = default;

  std::vector<PreTokenizerStep> steps_;
  std::vector<std::unique_ptr<Compiled>> compiled_;
};

}  // namespace baton

#endif  // BATON_MODEL_TOKENIZER_PRE_TOKENIZER_H_
