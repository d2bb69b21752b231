#include "model/tokenizer/tokenizer.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/tokenizer/bpe.h"
#include "model/tokenizer/byte_level.h"
#include "model/tokenizer/pre_tokenizer.h"
#include "model/tokenizer/tokenizer_spec.h"

namespace baton {
namespace {

// Special tokens that end a turn, by text.
constexpr absl::string_view kEogTexts[] = {
    "<|im_end|>", "<|eot_id|>",    "<|endoftext|>", "<|end_of_text|>",
    "<|eom_id|>", "<end_of_turn>", "<|end|>",       "</s>",
};

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' ||
         c == '\f';
}

const std::string& EmptyString() {
  static const std::string* empty = new std::string();
  return *empty;
}

}  // namespace

struct Tokenizer::Fragment {
  int32_t token;  // -1: raw text
  size_t begin;
  size_t end;
};

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(
    TokenizerSpec spec) {
  const size_t n = spec.texts.size();
  if (n == 0)
    return absl::InvalidArgumentError("tokenizer vocabulary is empty");
  if (n > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer vocabulary has ", n, " tokens, max 2^31-1"));
  }
  if (spec.types.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer has ", n, " tokens but ", spec.types.size(),
                     " token types"));
  }
  auto check_id = [n](const std::optional<int32_t>& id,
                      absl::string_view what) -> absl::Status {
    if (id.has_value() && (*id < 0 || static_cast<size_t>(*id) >= n)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " token id ", *id, " is outside the vocabulary [0, ", n, ")"));
    }
    return absl::OkStatus();
  };
  BATON_RETURN_IF_ERROR(check_id(spec.bos_id, "BOS"));
  BATON_RETURN_IF_ERROR(check_id(spec.eos_id, "EOS"));
  for (int32_t id : spec.extra_eog_ids) {
    BATON_RETURN_IF_ERROR(check_id(id, "end-of-generation"));
  }
  if (spec.add_bos && !spec.bos_id.has_value()) {
    return absl::InvalidArgumentError(
        "add_bos is set but there is no BOS token");
  }
  if (spec.add_eos && !spec.eos_id.has_value()) {
    return absl::InvalidArgumentError(
        "add_eos is set but there is no EOS token");
  }

  auto tok = std::unique_ptr<Tokenizer>(new Tokenizer());
  tok->bytes_.resize(n);
  std::vector<std::string> keys(n);
  tok->text_to_id_.reserve(n);
  for (size_t id = 0; id < n; ++id) {
    const std::string& text = spec.texts[id];
    const TokenType type = spec.types[id];
    tok->text_to_id_.emplace(text, static_cast<int32_t>(id));
    // BPE may produce any token whose byte-level text it builds (llama.cpp
    // looks all tokens up by text), so every token gets a key.
    byte_level::Decode(text, &keys[id]);
    switch (type) {
      case TokenType::kNormal:
      case TokenType::kByte:
        tok->bytes_[id] = keys[id];
        break;
      case TokenType::kUnused:
        break;
      case TokenType::kUnknown:
      case TokenType::kControl:
      case TokenType::kUserDefined:
        tok->bytes_[id] = text;
        if (!text.empty()) {
          tok->specials_.push_back({text, static_cast<int32_t>(id),
                                    !spec.lstrip.empty() && spec.lstrip[id],
                                    !spec.rstrip.empty() && spec.rstrip[id],
                                    type != TokenType::kUserDefined});
        }
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "token ", id, " has unknown type ", static_cast<int>(type)));
    }
  }
  std::stable_sort(tok->specials_.begin(), tok->specials_.end(),
                   [](const SpecialText& a, const SpecialText& b) {
                     return a.text.size() > b.text.size();
                   });
  std::vector<std::pair<std::string, std::string>> merges(spec.merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    byte_level::Decode(spec.merges[i].first, &merges[i].first);
    byte_level::Decode(spec.merges[i].second, &merges[i].second);
  }
  spec.merges.clear();
  BATON_ASSIGN_OR_RETURN(tok->bpe_, BpeModel::Create(keys, merges, spec.bpe));
  BATON_ASSIGN_OR_RETURN(tok->pre_,
                         PreTokenizer::Create(std::move(spec.pre_steps)));

  tok->texts_ = std::move(spec.texts);
  tok->types_ = std::move(spec.types);
  tok->bos_id_ = spec.bos_id;
  tok->eos_id_ = spec.eos_id;
  tok->add_bos_ = spec.add_bos;
  tok->add_eos_ = spec.add_eos;
  tok->eog_ids_ = std::move(spec.extra_eog_ids);
  if (spec.eos_id.has_value()) tok->eog_ids_.push_back(*spec.eos_id);
  for (absl::string_view text : kEogTexts) {
    std::optional<int32_t> id = tok->FindToken(text);
    if (id.has_value() && tok->types_[*id] != TokenType::kNormal &&
        tok->types_[*id] != TokenType::kByte) {
      tok->eog_ids_.push_back(*id);
    }
  }
  std::sort(tok->eog_ids_.begin(), tok->eog_ids_.end());
  tok->eog_ids_.erase(std::unique(tok->eog_ids_.begin(), tok->eog_ids_.end()),
                      tok->eog_ids_.end());
  tok->chat_template_ = std::move(spec.chat_template);
  tok->pre_name_ = std::move(spec.pre_name);
  tok->notes_ = std::move(spec.notes);
  return tok;
}

void Tokenizer::Partition(absl::string_view text, bool parse_special,
                          std::vector<Fragment>* fragments) const {
  fragments->clear();
  if (text.empty()) return;
  fragments->push_back({-1, 0, text.size()});
  std::vector<Fragment> next;
  for (const SpecialText& special : specials_) {
    if (special.control && !parse_special) continue;
    next.clear();
    for (const Fragment& f : *fragments) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t pos = f.begin;
      while (pos < f.end) {
        const size_t hit = text.substr(0, f.end).find(special.text, pos);
        if (hit == absl::string_view::npos) break;
        size_t left_end = hit;
        if (special.lstrip) {
          while (left_end > pos && IsAsciiSpace(text[left_end - 1])) --left_end;
        }
        if (left_end > pos) next.push_back({-1, pos, left_end});
        next.push_back({special.id, hit, hit + special.text.size()});
        pos = hit + special.text.size();
        if (special.rstrip) {
          while (pos < f.end && IsAsciiSpace(text[pos])) ++pos;
        }
      }
      if (pos < f.end) next.push_back({-1, pos, f.end});
    }
    fragments->swap(next);
  }
}

std::vector<int32_t> Tokenizer::Encode(absl::string_view text,
                                       const EncodeOptions& options) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (options.add_bos.value_or(add_bos_) && bos_id_.has_value()) {
    ids.push_back(*bos_id_);
  }
  std::vector<Fragment> fragments;
  Partition(text, options.parse_special, &fragments);
  std::vector<std::string> pieces;
  for (const Fragment& f : fragments) {
    if (f.token >= 0) {
      ids.push_back(f.token);
      continue;
    }
    pieces.clear();
    pre_->Split(text.substr(f.begin, f.end - f.begin), &pieces);
    for (const std::string& piece : pieces) bpe_->Encode(piece, &ids);
  }
  if (options.add_eos.value_or(add_eos_) && eos_id_.has_value()) {
    ids.push_back(*eos_id_);
  }
  return ids;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids,
                              bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (!IsValidId(id)) continue;
    if (skip_special && IsSpecial(id)) continue;
    out += bytes_[id];
  }
  return out;
}

const std::string& Tokenizer::TokenToBytes(int32_t id) const {
  return IsValidId(id) ? bytes_[id] : EmptyString();
}

const std::string& Tokenizer::TokenText(int32_t id) const {
  return IsValidId(id) ? texts_[id] : EmptyString();
}

TokenType Tokenizer::token_type(int32_t id) const {
  return IsValidId(id) ? types_[id] : TokenType::kUnused;
}

bool Tokenizer::IsEndOfGeneration(int32_t id) const {
  return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

bool Tokenizer::IsSpecial(int32_t id) const {
  if (!IsValidId(id)) return false;
  return types_[id] == TokenType::kControl || types_[id] == TokenType::kUnknown;
}

std::optional<int32_t> Tokenizer::FindToken(absl::string_view text) const {
  auto it = text_to_id_.find(std::string(text));
  if (it == text_to_id_.end()) return std::nullopt;
  return it->second;
}

}  // namespace baton
