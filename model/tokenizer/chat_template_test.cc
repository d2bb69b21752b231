#include "model/tokenizer/chat_template.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gguf/gguf_file.h"
#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/tokenizer_testing.h"
#include "nlohmann/json.hpp"

namespace baton {
namespace {

using ::testing::HasSubstr;

// Baton's ChatML rendering equals the model's Jinja template rendered by
// jinja2 (scripts/reference/tokenizer_chat_golden.py).
TEST(ChatTemplateTest, MatchesJinjaGolden) {
  auto path = tokenizer_testing::DataPath("smollm2_chat_golden.json");
  ASSERT_TRUE(path.ok()) << path.status();
  auto text = tokenizer_testing::ReadFile(*path);
  ASSERT_TRUE(text.ok()) << text.status();
  nlohmann::json golden = nlohmann::json::parse(*text, nullptr, false);
  ASSERT_FALSE(golden.is_discarded());

  // The golden file's template is the default model's.
  auto model = tokenizer_testing::RequireEnv("BATON_DEFAULT_MODEL");
  ASSERT_TRUE(model.ok()) << model.status();
  auto gguf = GgufFile::Open(*model);
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto tok = Tokenizer::FromGguf(**gguf);
  ASSERT_TRUE(tok.ok()) << tok.status();
  ASSERT_EQ((*tok)->chat_template_source(),
            golden["template_source"].get<std::string>())
      << "regenerate the golden file";

  auto tmpl = ChatTemplate::ForTokenizer(**tok);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  EXPECT_EQ(tmpl->format(), ChatTemplateFormat::kChatMl);
  EXPECT_FALSE(tmpl->is_fallback());
  EXPECT_EQ(tmpl->default_system_message(),
            std::optional<std::string>("You are a helpful AI assistant named "
                                       "SmolLM, trained by Hugging Face"));
  int compared = 0;
  for (const auto& c : golden["cases"]) {
    std::vector<ChatMessage> messages;
    for (const auto& m : c["messages"]) {
      messages.push_back(
          {m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    EXPECT_EQ(tmpl->Apply(messages, c["add_generation_prompt"].get<bool>()),
              c["rendered"].get<std::string>())
        << c["name"].get<std::string>();
    ++compared;
  }
  EXPECT_EQ(compared, 20);
}

TEST(ChatTemplateTest, ChatMlPromptEncodesWithSpecialTokens) {
  auto model = tokenizer_testing::RequireEnv("BATON_DEFAULT_MODEL");
  ASSERT_TRUE(model.ok()) << model.status();
  auto gguf = GgufFile::Open(*model);
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto tok = Tokenizer::FromGguf(**gguf);
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto tmpl = ChatTemplate::ForTokenizer(**tok);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  const std::vector<ChatMessage> messages = {{"user", "Hi"}};
  const std::vector<int32_t> ids = (*tok)->Encode(tmpl->Apply(messages, true));
  // <|im_start|> opens the system turn, the user turn and the generation
  // prompt.
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 3);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 2);
}

TEST(ChatTemplateTest, Llama3Format) {
  auto tmpl = ChatTemplate::FromSource(
      "{% set loop_messages = messages %}{% for message in loop_messages %}"
      "{% set content = '<|start_header_id|>' + message['role'] + "
      "'<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}"
      "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% "
      "endif %}"
      "{{ content }}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  EXPECT_EQ(tmpl->format(), ChatTemplateFormat::kLlama3);
  EXPECT_TRUE(tmpl->renders_bos());
  const std::vector<ChatMessage> messages = {{"system", "Be brief."},
                                             {"user", "  Hi!\n"}};
  EXPECT_EQ(tmpl->Apply(messages, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
            "Hi!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateTest, QwenStyleEscapedDefaultSystem) {
  auto tmpl = ChatTemplate::FromSource(
      "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + "
      "messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}"
      "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
      "{%- endif %}...");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  EXPECT_EQ(tmpl->default_system_message(),
            std::optional<std::string>("You are a helpful assistant."));
}

TEST(ChatTemplateTest, UnknownTemplateIsAnErrorUnlessFallbackAllowed) {
  const char* kGemma = "{{ '<start_of_turn>' + role + '\n' }}";
  auto strict = ChatTemplate::FromSource(kGemma);
  EXPECT_EQ(strict.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(strict.status().message(), HasSubstr("not recognised"));
  auto missing = ChatTemplate::FromSource("");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);

  ChatTemplateOptions options;
  options.allow_chatml_fallback = true;
  auto loose = ChatTemplate::FromSource(kGemma, options);
  ASSERT_TRUE(loose.ok()) << loose.status();
  EXPECT_TRUE(loose->is_fallback());
  EXPECT_EQ(loose->format(), ChatTemplateFormat::kChatMl);
  const std::vector<ChatMessage> messages = {{"user", "x"}};
  EXPECT_EQ(loose->Apply(messages, false), "<|im_start|>user\nx<|im_end|>\n");
}

TEST(ChatTemplateTest, Llama31TemplateIsRejected) {
  auto tmpl = ChatTemplate::FromSource(
      "<|start_header_id|>system<|end_header_id|>Cutting Knowledge Date: "
      "December 2023<|eot_id|>");
  EXPECT_EQ(tmpl.status().code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace baton
