// libFuzzer target: arbitrary bytes as a model's chat template source,
// followed (after the first NUL byte) by a conversation, one message per
// line as "role\tcontent". Recognising the template succeeds or returns a
// status with a message (never an exception or sanitizer report); a
// recognised template renders every conversation, and the rendered prompt
// holds every message's content (trimmed, for Llama-3).
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/check.h"
#include "model/tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const absl::string_view source = input.substr(0, nul);
  auto chat = baton::ChatTemplate::FromSource(source);
  if (!chat.ok()) {
    BATON_CHECK(!chat.status().message().empty())
        << "an error without a message";
    return 0;
  }
  std::vector<baton::ChatMessage> messages;
  if (nul != absl::string_view::npos) {
    for (absl::string_view line :
         absl::StrSplit(input.substr(nul + 1), '\n', absl::SkipEmpty())) {
      std::pair<absl::string_view, absl::string_view> parts =
          absl::StrSplit(line, absl::MaxSplits('\t', 1));
      messages.push_back({std::string(parts.first), std::string(parts.second)});
    }
  }
  for (bool generation_prompt : {true, false}) {
    const std::string prompt = chat->Apply(messages, generation_prompt);
    for (const baton::ChatMessage& m : messages) {
      const absl::string_view content =
          chat->format() == baton::ChatTemplateFormat::kLlama3
              ? absl::StripAsciiWhitespace(m.content)
              : absl::string_view(m.content);
      BATON_CHECK(absl::StrContains(prompt, content))
          << "a message's content is missing from the rendered prompt";
    }
  }
  return 0;
}
