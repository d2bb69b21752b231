#include "coordinator/http/openai_request.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::http {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

absl::StatusOr<OpenAiRequest> Chat(const std::string& body) {
  return ParseOpenAiRequest(Endpoint::kChat, body);
}
absl::StatusOr<OpenAiRequest> Completion(const std::string& body) {
  return ParseOpenAiRequest(Endpoint::kCompletion, body);
}

// The error message of a request that must fail with InvalidArgument.
std::string Error(const absl::StatusOr<OpenAiRequest>& r) {
  EXPECT_FALSE(r.ok());
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

TEST(OpenAiRequestTest, MinimalChatFillsTheContext) {
  auto r = Chat(R"({"model": "m", "messages": [
      {"role": "developer", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi "},
                                   {"type": "text", "text": "there"}]}]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model, "m");
  EXPECT_FALSE(r->stream);
  EXPECT_EQ(r->n, 1);
  EXPECT_TRUE(r->fill_context);
  ASSERT_EQ(r->prompts.size(), 1u);
  const v1::GenerateRequest& g = r->prompts[0];
  EXPECT_EQ(g.model(), "m");
  ASSERT_EQ(g.chat().messages_size(), 2);
  EXPECT_EQ(g.chat().messages(0).role(), "system");
  EXPECT_EQ(g.chat().messages(1).content(), "Hi there");
  EXPECT_FALSE(g.sampling().has_max_tokens());
  EXPECT_FALSE(g.sampling().has_seed());
  EXPECT_FALSE(g.sampling().has_logprobs());
}

TEST(OpenAiRequestTest, MapsEverySamplingField) {
  auto r =
      Chat(R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
      "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
      "min_p": 0.05, "repetition_penalty": 1.1, "presence_penalty": 0.5,
      "frequency_penalty": -0.5, "seed": 42, "ignore_eos": true,
      "stop": ["a", "b"], "logprobs": true, "top_logprobs": 3, "n": 2,
      "user": "u", "stream": true, "stream_options": {"include_usage": true}})");
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::SamplingParams& s = r->prompts[0].sampling();
  EXPECT_EQ(s.max_tokens(), 7);
  EXPECT_DOUBLE_EQ(s.temperature(), 0.5);
  EXPECT_DOUBLE_EQ(s.top_p(), 0.9);
  EXPECT_EQ(s.top_k(), 40);
  EXPECT_DOUBLE_EQ(s.min_p(), 0.05);
  EXPECT_DOUBLE_EQ(s.repetition_penalty(), 1.1);
  EXPECT_DOUBLE_EQ(s.presence_penalty(), 0.5);
  EXPECT_DOUBLE_EQ(s.frequency_penalty(), -0.5);
  EXPECT_EQ(s.seed(), 42u);
  EXPECT_TRUE(s.ignore_eos());
  ASSERT_EQ(s.stop_size(), 2);
  EXPECT_EQ(s.stop(1), "b");
  EXPECT_EQ(s.logprobs(), 3);
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(r->top_logprobs, 3);
  EXPECT_EQ(r->n, 2);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_FALSE(r->fill_context);
}

TEST(OpenAiRequestTest, MaxCompletionTokensWinsAndTopKMinusOneIsOff) {
  auto r =
      Chat(R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
      "max_tokens": 7, "max_completion_tokens": 9, "top_k": -1,
      "stop": "END"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompts[0].sampling().max_tokens(), 9);
  EXPECT_EQ(r->prompts[0].sampling().top_k(), 0);
  ASSERT_EQ(r->prompts[0].sampling().stop_size(), 1);
  EXPECT_EQ(r->prompts[0].sampling().stop(0), "END");
}

TEST(OpenAiRequestTest, CompletionPromptShapes) {
  auto text = Completion(R"({"model": "m", "prompt": "Once"})");
  ASSERT_TRUE(text.ok()) << text.status();
  ASSERT_EQ(text->prompts.size(), 1u);
  EXPECT_EQ(text->prompts[0].text(), "Once");
  EXPECT_FALSE(text->fill_context);  // completions default: Baton's 16

  auto many = Completion(
      R"({"model": "m", "prompt": ["a", "b c"], "logprobs": 2, "n": 3})");
  ASSERT_TRUE(many.ok()) << many.status();
  ASSERT_EQ(many->prompts.size(), 2u);
  EXPECT_EQ(many->prompts[0].text(), "a");
  EXPECT_EQ(many->prompts[1].text(), "b c");
  EXPECT_TRUE(many->logprobs);
  EXPECT_EQ(many->top_logprobs, 2);
  EXPECT_EQ(many->prompts[1].sampling().logprobs(), 2);

  auto ids = Completion(R"({"model": "m", "prompt": [5, 6, 7]})");
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->prompts.size(), 1u);
  EXPECT_EQ(ids->prompts[0].token_ids().token_ids(2), 7);

  auto arrays = Completion(R"({"model": "m", "prompt": [[5], [6, 7]]})");
  ASSERT_TRUE(arrays.ok()) << arrays.status();
  ASSERT_EQ(arrays->prompts.size(), 2u);
  EXPECT_EQ(arrays->prompts[1].token_ids().token_ids_size(), 2);
}

// Strings only or token-id arrays only, and none empty, naming the prompt.
TEST(OpenAiRequestTest, MixedOrEmptyPromptsNameThePrompt) {
  EXPECT_THAT(Error(Completion(R"({"model": "m", "prompt": ["a", [1]]})")),
              HasSubstr("prompt[1] is array but prompt[0] is string"));
  EXPECT_THAT(Error(Completion(R"({"model": "m", "prompt": [[1], "a"]})")),
              HasSubstr("prompt[1] is string but prompt[0] is array"));
  EXPECT_THAT(Error(Completion(R"({"model": "m", "prompt": ""})")),
              StartsWith("prompt must not be empty"));
  EXPECT_THAT(Error(Completion(R"({"model": "m", "prompt": ["a", ""]})")),
              StartsWith("prompt[1] must not be empty"));
  EXPECT_THAT(Error(Completion(R"({"model": "m", "prompt": [[1], []]})")),
              StartsWith("prompt[1] must hold at least one token id"));
  EXPECT_THAT(Error(Completion(R"({"model": "m", "prompt": [[]]})")),
              StartsWith("prompt[0] must hold at least one token id"));
}

TEST(OpenAiRequestTest, ChoiceSeedsAdvanceByChoiceIndex) {
  auto r = Completion(
      R"({"model": "m", "prompt": ["a", "b"], "n": 2, "seed": 100})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ChoiceRequest(*r, 0, 0, "id-0").sampling().seed(), 100u);
  EXPECT_EQ(ChoiceRequest(*r, 0, 1, "id-1").sampling().seed(), 101u);
  const v1::GenerateRequest last = ChoiceRequest(*r, 1, 1, "id-3");
  EXPECT_EQ(last.sampling().seed(), 103u);
  EXPECT_EQ(last.text(), "b");
  EXPECT_EQ(last.request_id(), "id-3");

  auto unseeded = Completion(R"({"model": "m", "prompt": "a", "n": 2})");
  ASSERT_TRUE(unseeded.ok());
  EXPECT_FALSE(ChoiceRequest(*unseeded, 0, 1, "x").sampling().has_seed());
}

TEST(OpenAiRequestTest, InvalidBodies) {
  EXPECT_THAT(Error(Chat("{not json")), HasSubstr("not valid JSON"));
  EXPECT_THAT(Error(Chat("[1, 2]")), HasSubstr("must be a JSON object"));
  EXPECT_THAT(Error(Chat(R"({"messages": []})")), StartsWith("model"));
  EXPECT_THAT(Error(Chat(R"({"model": 3})")),
              StartsWith("model must be a string"));
  EXPECT_THAT(Error(Chat(R"({"model": "m"})")),
              StartsWith("messages is required"));
  EXPECT_THAT(Error(Chat(R"({"model": "m", "messages": []})")),
              StartsWith("messages must be a non-empty array"));
  EXPECT_THAT(Error(Completion(R"({"model": "m"})")),
              StartsWith("prompt is required"));
  EXPECT_THAT(Error(Completion(R"({"model": "m", "prompt": {"a": 1}})")),
              StartsWith("prompt must be"));
  EXPECT_THAT(Error(Completion(R"({"model": "m", "prompt": [1, -2]})")),
              StartsWith("prompt[1] must be a token id"));
}

TEST(OpenAiRequestTest, WrongTypesAndRangesNameTheField) {
  const std::string base =
      R"({"model": "m", "messages": [{"role": "user", "content": "x"}], )";
  struct Case {
    const char* field;
    const char* expected;
  };
  const Case cases[] = {
      {R"("temperature": "hot")", "temperature must be a number, got string"},
      {R"("max_tokens": 2.5)", "max_tokens must be an integer, got number"},
      {R"("max_tokens": 0)", "max_tokens must be in [1, "},
      {R"("n": 0)", "n must be in [1, 16], got 0"},
      {R"("n": 17)", "n must be in [1, 16], got 17"},
      {R"("stream": "yes")", "stream must be a boolean, got string"},
      {R"("seed": -1)", "seed must be in [0, "},
      {R"("stop": 5)", "stop must be a string or an array of strings"},
      {R"("stop": ["a", 1])", "stop[1] must be a string"},
      {R"("top_logprobs": 2)", "top_logprobs requires logprobs to be true"},
      {R"("logprobs": true, "top_logprobs": 21)",
       "top_logprobs must be in [0, 20]"},
      {R"("stream_options": {"include_usage": true})",
       "stream_options is only allowed when stream is true"},
      {R"("tools": [{"type": "function"}])", "tools is not supported"},
      {R"("response_format": {"type": "json_object"})",
       "response_format is not supported"},
      {R"("user": 5)", "user must be a string"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    EXPECT_THAT(Error(Chat(base + c.field + "}")), StartsWith(c.expected));
  }
  EXPECT_THAT(
      Error(Chat(R"({"model": "m", "messages": [{"role": "user", "content":
          [{"type": "image_url", "image_url": {"url": "x"}}]}]})")),
      StartsWith("messages[0].content[0] must be"));
  EXPECT_THAT(Error(Chat(R"({"model": "m", "messages": [{"content": "x"}]})")),
              StartsWith("messages[0].role must be a string"));
  EXPECT_THAT(
      Error(Completion(R"({"model": "m", "prompt": "a", "echo": true})")),
      StartsWith("echo is not supported"));
  EXPECT_THAT(
      Error(Completion(R"({"model": "m", "prompt": "a", "best_of": 2})")),
      StartsWith("best_of > 1 is not supported"));
}

TEST(OpenAiRequestTest, NullMeansAbsentAndUnknownFieldsAreIgnored) {
  auto r =
      Chat(R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
      "temperature": null, "stop": null, "seed": null, "metadata": {"a": 1},
      "store": false, "tools": [], "logit_bias": {}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->prompts[0].sampling().has_temperature());
  EXPECT_EQ(r->prompts[0].sampling().stop_size(), 0);
}

}  // namespace
}  // namespace baton::http
