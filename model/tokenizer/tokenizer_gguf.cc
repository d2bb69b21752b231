// Tokenizer::FromGguf: reads the tokenizer.ggml.* / tokenizer.chat_template
// metadata keys.
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/tokenizer/pre_tokenizer.h"
#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/tokenizer_spec.h"

namespace baton {
namespace {

struct PreChoice {
  std::vector<PreTokenizerStep> steps;
  bool known;
};

PreTokenizerStep Isolated(absl::string_view pattern) {
  return {std::string(pattern), false, SplitBehavior::kIsolated};
}

// Regexes per tokenizer.ggml.pre value, as llama.cpp and the models'
// tokenizer.json define them.
PreChoice ChoosePre(absl::string_view pre) {
  if (pre == "gpt-2" || pre == "default" || pre == "mpt" || pre == "olmo" ||
      pre == "jais") {
    return {{Isolated(kGpt2Pattern)}, true};
  }
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" ||
      pre == "command-r" || pre == "codeshell" || pre == "exaone") {
    return {{Isolated(kSingleDigitPattern), Isolated(kGpt2Pattern)}, true};
  }
  if (pre == "llama-bpe" || pre == "llama3" || pre == "smaug-bpe" ||
      pre == "falcon3" || pre == "pixtral") {
    return {{Isolated(kLlama3Pattern)}, true};
  }
  if (pre == "qwen2" || pre == "stablelm2" || pre == "deepseek-r1-qwen") {
    return {{Isolated(kQwen2Pattern)}, true};
  }
  return {{Isolated(kGpt2Pattern)}, false};
}

absl::StatusOr<std::optional<int32_t>> OptionalId(const GgufFile& gguf,
                                                  absl::string_view key) {
  if (gguf.Find(key) == nullptr) return std::optional<int32_t>();
  BATON_ASSIGN_OR_RETURN(int64_t v, gguf.GetInt(key));
  // llama.cpp writes -1 (as uint32 0xFFFFFFFF in some files) for "none".
  if (v == -1 || v == 0xFFFFFFFFll) return std::optional<int32_t>();
  if (v < 0 || v > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF key ", key, " = ", v, " is not a token id"));
  }
  return std::optional<int32_t>(static_cast<int32_t>(v));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(
    const GgufFile& gguf) {
  BATON_ASSIGN_OR_RETURN(absl::string_view model,
                         gguf.GetString("tokenizer.ggml.model"));
  if (model != "gpt2") {
    return absl::UnimplementedError(
        absl::StrCat("tokenizer.ggml.model '", model,
                     "' is not supported (only 'gpt2', byte-level BPE)"));
  }
  TokenizerSpec spec;
  BATON_ASSIGN_OR_RETURN(
      const GgufArray* tokens,
      gguf.GetArray("tokenizer.ggml.tokens", GgufType::kString));
  const size_t n = tokens->size();
  spec.texts.reserve(n);
  for (size_t i = 0; i < n; ++i) spec.texts.emplace_back(tokens->GetString(i));

  spec.types.assign(n, TokenType::kNormal);
  if (gguf.Find("tokenizer.ggml.token_type") != nullptr) {
    BATON_ASSIGN_OR_RETURN(
        const GgufArray* types,
        gguf.GetArray("tokenizer.ggml.token_type", GgufType::kInt32));
    if (types->size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.ggml.token_type has ", types->size(),
                       " entries, tokenizer.ggml.tokens has ", n));
    }
    for (size_t i = 0; i < n; ++i) {
      BATON_ASSIGN_OR_RETURN(int64_t t, types->Get(i).AsInt());
      if (t < 1 || t > 6) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tokenizer.ggml.token_type[", i, "] = ", t, ", allowed 1..6"));
      }
      spec.types[i] = static_cast<TokenType>(t);
    }
  }

  if (gguf.Find("tokenizer.ggml.merges") == nullptr) {
    return absl::InvalidArgumentError(
        "GGUF has tokenizer.ggml.model 'gpt2' but no tokenizer.ggml.merges");
  }
  BATON_ASSIGN_OR_RETURN(
      const GgufArray* merges,
      gguf.GetArray("tokenizer.ggml.merges", GgufType::kString));
  spec.merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const absl::string_view m = merges->GetString(i);
    // "left right"; the separator is the first space after the first
    // character (a part may itself start with the space's byte-level char).
    const size_t sep = m.size() > 1 ? m.find(' ', 1) : absl::string_view::npos;
    if (sep == absl::string_view::npos || sep + 1 >= m.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer.ggml.merges[", i, "] = '", m, "' is not 'left right'"));
    }
    spec.merges.emplace_back(std::string(m.substr(0, sep)),
                             std::string(m.substr(sep + 1)));
  }

  std::string pre = "default";
  if (gguf.Find("tokenizer.ggml.pre") != nullptr) {
    BATON_ASSIGN_OR_RETURN(absl::string_view p,
                           gguf.GetString("tokenizer.ggml.pre"));
    pre = std::string(p);
  }
  PreChoice choice = ChoosePre(pre);
  spec.pre_steps = std::move(choice.steps);
  spec.pre_name = absl::StrCat("gguf pre '", pre, "'");
  if (!choice.known) {
    spec.notes.push_back(absl::StrCat(
        "unknown tokenizer.ggml.pre '", pre,
        "': using the GPT-2 pre-tokenizer regex; tokens may differ from the "
        "model's own tokenizer"));
  }
  spec.bpe.ignore_merges = pre == "llama-bpe" || pre == "llama3";

  BATON_ASSIGN_OR_RETURN(spec.bos_id,
                         OptionalId(gguf, "tokenizer.ggml.bos_token_id"));
  BATON_ASSIGN_OR_RETURN(spec.eos_id,
                         OptionalId(gguf, "tokenizer.ggml.eos_token_id"));
  for (absl::string_view key :
       {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    BATON_ASSIGN_OR_RETURN(std::optional<int32_t> id, OptionalId(gguf, key));
    if (id.has_value()) spec.extra_eog_ids.push_back(*id);
  }
  BATON_ASSIGN_OR_RETURN(spec.add_bos,
                         gguf.GetBoolOr("tokenizer.ggml.add_bos_token", false));
  BATON_ASSIGN_OR_RETURN(spec.add_eos,
                         gguf.GetBoolOr("tokenizer.ggml.add_eos_token", false));
  if (spec.add_bos && !spec.bos_id.has_value()) {
    return absl::InvalidArgumentError(
        "tokenizer.ggml.add_bos_token is true but there is no bos_token_id");
  }
  if (spec.add_eos && !spec.eos_id.has_value()) {
    return absl::InvalidArgumentError(
        "tokenizer.ggml.add_eos_token is true but there is no eos_token_id");
  }
  if (gguf.Find("tokenizer.chat_template") != nullptr) {
    BATON_ASSIGN_OR_RETURN(absl::string_view t,
                           gguf.GetString("tokenizer.chat_template"));
    spec.chat_template = std::string(t);
  }
  return Create(std::move(spec));
}

}  // namespace baton
