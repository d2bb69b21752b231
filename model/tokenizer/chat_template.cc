#include "model/tokenizer/chat_template.h"

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace baton {
namespace {

constexpr absl::string_view kImStart = "<|im_start|>";
constexpr absl::string_view kImEnd = "<|im_end|>";

// A default system message written literally in a ChatML template: the text
// between "<|im_start|>system" + newline (a real one or the escape "\n") and
// the next "<|im_end|>", if it contains no Jinja expression or quote.
std::optional<std::string> FindDefaultSystem(absl::string_view src) {
  const std::string head = absl::StrCat(kImStart, "system");
  size_t pos = 0;
  while ((pos = src.find(head, pos)) != absl::string_view::npos) {
    size_t body = pos + head.size();
    pos = body;
    if (absl::StartsWith(src.substr(body), "\n")) {
      body += 1;
    } else if (absl::StartsWith(src.substr(body), "\\n")) {
      body += 2;
    } else {
      continue;
    }
    const size_t end = src.find(kImEnd, body);
    if (end == absl::string_view::npos) return std::nullopt;
    const absl::string_view raw = src.substr(body, end - body);
    if (raw.empty() || absl::StrContains(raw, "{") ||
        absl::StrContains(raw, "'") || absl::StrContains(raw, "\"") ||
        absl::StrContains(raw, "\n")) {
      continue;
    }
    std::string text;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '\\' && i + 1 < raw.size() && raw[i + 1] == 'n') {
        text += '\n';
        ++i;
      } else {
        text += raw[i];
      }
    }
    return text;
  }
  return std::nullopt;
}

absl::string_view TrimAsciiSpace(absl::string_view s) {
  auto space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' ||
           c == '\f';
  };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

ChatTemplate ChatTemplate::Make(ChatTemplateFormat format,
                                std::optional<std::string> default_system) {
  ChatTemplate t;
  t.format_ = format;
  t.default_system_ = std::move(default_system);
  return t;
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromSource(
    absl::string_view src, const ChatTemplateOptions& options) {
  if (absl::StrContains(src, "<|start_header_id|>") &&
      absl::StrContains(src, "<|end_header_id|>") &&
      absl::StrContains(src, "<|eot_id|>")) {
    if (absl::StrContains(src, "Cutting Knowledge Date")) {
      return absl::UnimplementedError(
          "Llama-3.1-style chat template (date header, tools) is not "
          "supported");
    }
    return Make(ChatTemplateFormat::kLlama3, std::nullopt);
  }
  if (absl::StrContains(src, kImStart) && absl::StrContains(src, kImEnd)) {
    return Make(ChatTemplateFormat::kChatMl, FindDefaultSystem(src));
  }
  if (options.allow_chatml_fallback) {
    ChatTemplate t = Make(ChatTemplateFormat::kChatMl, std::nullopt);
    t.is_fallback_ = true;
    return t;
  }
  if (src.empty()) {
    return absl::NotFoundError("the model has no chat template");
  }
  return absl::UnimplementedError(absl::StrCat(
      "chat template not recognised as ChatML or Llama-3 (starts with '",
      src.substr(0, 60), "')"));
}

absl::StatusOr<ChatTemplate> ChatTemplate::ForTokenizer(
    const Tokenizer& tokenizer, const ChatTemplateOptions& options) {
  return FromSource(tokenizer.chat_template_source(), options);
}

std::string ChatTemplate::Apply(std::span<const ChatMessage> messages,
                                bool add_generation_prompt) const {
  std::string out;
  if (format_ == ChatTemplateFormat::kLlama3) {
    out = "<|begin_of_text|>";
    for (const ChatMessage& m : messages) {
      absl::StrAppend(&out, "<|start_header_id|>", m.role,
                      "<|end_header_id|>\n\n", TrimAsciiSpace(m.content),
                      "<|eot_id|>");
    }
    if (add_generation_prompt) {
      absl::StrAppend(&out,
                      "<|start_header_id|>assistant<|end_header_id|>\n\n");
    }
    return out;
  }
  if (default_system_.has_value() && !messages.empty() &&
      messages[0].role != "system") {
    absl::StrAppend(&out, kImStart, "system\n", *default_system_, kImEnd, "\n");
  }
  for (const ChatMessage& m : messages) {
    absl::StrAppend(&out, kImStart, m.role, "\n", m.content, kImEnd, "\n");
  }
  if (add_generation_prompt) absl::StrAppend(&out, kImStart, "assistant\n");
  return out;
}

}  // namespace baton
