// Chat prompt formatting. Instead of running Jinja, Baton recognises the
// model's chat_template metadata as one of the formats below and renders that
// format natively; tests compare the output with the Jinja template rendered
// by Python (tests/data/tokenizer/smollm2_chat_golden.json).
//
//   ChatML:  [<|im_start|>system\n{default}<|im_end|>\n]   (if the template
//              inserts a default system message and messages[0] is not one)
//            <|im_start|>{role}\n{content}<|im_end|>\n ...
//            [<|im_start|>assistant\n]                      (generation prompt)
//   Llama-3: <|begin_of_text|>
//            <|start_header_id|>{role}<|end_header_id|>\n\n{trim(content)}<|eot_id|>
//            ...
//            [<|start_header_id|>assistant<|end_header_id|>\n\n]
//
// An unrecognised template is an error unless the caller opts into the ChatML
// fallback, which is then visible through is_fallback().
#ifndef BATON_MODEL_TOKENIZER_CHAT_TEMPLATE_H_
#define BATON_MODEL_TOKENIZER_CHAT_TEMPLATE_H_

#include <optional>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/tokenizer/tokenizer.h"

namespace baton {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

enum class ChatTemplateFormat {
  kChatMl,
  kLlama3,
};

struct ChatTemplateOptions {
  // A missing or unrecognised template: false -> NotFound / Unimplemented;
  // true -> plain ChatML (no default system message), is_fallback() == true.
  bool allow_chatml_fallback = false;
};

class ChatTemplate {
 public:
  // Recognises `jinja_source` (a model's tokenizer.chat_template).
  static absl::StatusOr<ChatTemplate> FromSource(
      absl::string_view jinja_source, const ChatTemplateOptions& options = {});
  // FromSource(tokenizer.chat_template_source()).
  static absl::StatusOr<ChatTemplate> ForTokenizer(
      const Tokenizer& tokenizer, const ChatTemplateOptions& options = {});
  // A template of a known format, e.g. for tests.
  static ChatTemplate Make(ChatTemplateFormat format,
                           std::optional<std::string> default_system_message);

  ChatTemplateFormat format() const { return format_; }
  bool is_fallback() const { return is_fallback_; }
  // ChatML: the system message the template inserts when the conversation
  // does not start with one.
  const std::optional<std::string>& default_system_message() const {
    return default_system_;
  }
  // True if the rendered prompt starts with the BOS token text; encode it
  // with add_bos = false then. Always encode with parse_special = true.
  bool renders_bos() const { return format_ == ChatTemplateFormat::kLlama3; }

  std::string Apply(std::span<const ChatMessage> messages,
                    bool add_generation_prompt) const;

 private:
  ChatTemplate() = default;
  ChatTemplateFormat format_ = ChatTemplateFormat::kChatMl;
  bool is_fallback_ = false;
  std::optional<std::string> default_system_;
};

}  // namespace baton

#endif  // BATON_MODEL_TOKENIZER_CHAT_TEMPLATE_H_
