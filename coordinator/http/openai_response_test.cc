#include "coordinator/http/openai_response.h"

#include <string>

#include "coordinator/http/openai_error.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::http {
namespace {

using Json = nlohmann::json;

// Token 7 is "\xC3" (half of "é"), every other id is "t<id>".
std::string FakeBytes(int32_t id) {
  return id == 7 ? std::string("\xC3") : "t" + std::to_string(id);
}

OpenAiRequest Request(Endpoint endpoint, bool logprobs, bool include_usage) {
  OpenAiRequest r;
  r.endpoint = endpoint;
  r.model = "smol";
  r.logprobs = logprobs;
  r.top_logprobs = logprobs ? 2 : 0;
  r.stream = include_usage;
  r.include_usage = include_usage;
  return r;
}

google::protobuf::RepeatedPtrField<v1::TokenLogprobs> TwoTokens() {
  google::protobuf::RepeatedPtrField<v1::TokenLogprobs> out;
  v1::TokenLogprobs* a = out.Add();
  a->set_token_id(5);
  a->set_logprob(-0.5f);
  v1::TokenLogprob* alt = a->add_top_logprobs();
  alt->set_token_id(5);
  alt->set_logprob(-0.5f);
  alt = a->add_top_logprobs();
  alt->set_token_id(9);
  alt->set_logprob(-1.5f);
  v1::TokenLogprobs* b = out.Add();
  b->set_token_id(7);
  b->set_logprob(-2.0f);
  return out;
}

TEST(OpenAiResponseTest, ChatChunksHaveOpenAiShape) {
  ResponseFormatter f(Request(Endpoint::kChat, false, true), "chatcmpl-1", 123,
                      FakeBytes);
  const Json role = f.RoleChunk(0);
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["id"], "chatcmpl-1");
  EXPECT_EQ(role["created"], 123);
  EXPECT_EQ(role["model"], "smol");
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(role["usage"].is_null());
  EXPECT_TRUE(role.contains("usage"));

  const Json text = f.TextChunk(1, "Hello", nullptr);
  EXPECT_EQ(text["choices"][0]["index"], 1);
  EXPECT_EQ(text["choices"][0]["delta"]["content"], "Hello");
  EXPECT_TRUE(text["choices"][0]["finish_reason"].is_null());

  const Json finish = f.FinishChunk(1, "length");
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(finish["choices"][0]["delta"].empty());

  v1::Usage usage;
  usage.set_prompt_tokens(10);
  usage.set_completion_tokens(4);
  const Json last = f.UsageChunk(usage);
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"]["total_tokens"], 14);
}

TEST(OpenAiResponseTest, CompletionChunksAndSseFraming) {
  ResponseFormatter f(Request(Endpoint::kCompletion, false, false), "cmpl-1", 1,
                      FakeBytes);
  const Json chunk = f.TextChunk(0, "abc", nullptr);
  EXPECT_EQ(chunk["object"], "text_completion");
  EXPECT_EQ(chunk["choices"][0]["text"], "abc");
  EXPECT_FALSE(chunk.contains("usage"));
  const std::string event = SseEvent(chunk);
  EXPECT_EQ(event.rfind("data: {", 0), 0u);
  EXPECT_EQ(event.substr(event.size() - 2), "\n\n");
  EXPECT_EQ(Json::parse(event.substr(6)), chunk);
  EXPECT_STREQ(kSseDone, "data: [DONE]\n\n");
  EXPECT_EQ(f.FinishChunk(0, "stop")["choices"][0]["text"], "");
}

TEST(OpenAiResponseTest, ChatLogprobsWithBytesAndAlternatives) {
  ResponseFormatter f(Request(Endpoint::kChat, true, false), "c", 1, FakeBytes);
  Json lp = f.NewLogprobs();
  int64_t offset = 0;
  f.AppendLogprobs(TwoTokens(), lp, offset);
  ASSERT_EQ(lp["content"].size(), 2u);
  const Json& first = lp["content"][0];
  EXPECT_EQ(first["token"], "t5");
  EXPECT_DOUBLE_EQ(first["logprob"].get<double>(), -0.5);
  EXPECT_EQ(first["bytes"], Json::array({'t', '5'}));
  ASSERT_EQ(first["top_logprobs"].size(), 2u);
  EXPECT_EQ(first["top_logprobs"][1]["token"], "t9");
  // Half a character: the bytes are exact, the string is repaired.
  EXPECT_EQ(lp["content"][1]["bytes"], Json::array({0xC3}));
  EXPECT_EQ(DumpJson(lp["content"][1]["token"]), "\"\xEF\xBF\xBD\"");
}

TEST(OpenAiResponseTest, CompletionLogprobsHaveOffsets) {
  ResponseFormatter f(Request(Endpoint::kCompletion, true, false), "c", 1,
                      FakeBytes);
  Json lp = f.NewLogprobs();
  int64_t offset = 3;
  f.AppendLogprobs(TwoTokens(), lp, offset);
  EXPECT_EQ(lp["tokens"], Json::array({"t5", "\xC3"}));
  EXPECT_EQ(lp["text_offset"], Json::array({3, 5}));
  EXPECT_EQ(offset, 6);
  EXPECT_DOUBLE_EQ(lp["top_logprobs"][0]["t9"].get<double>(), -1.5);
  EXPECT_TRUE(lp["top_logprobs"][1].empty());
}

TEST(OpenAiResponseTest, NonStreamingCompletion) {
  ResponseFormatter chat(Request(Endpoint::kChat, false, false), "c", 9,
                         FakeBytes);
  v1::Usage usage;
  usage.set_prompt_tokens(3);
  usage.set_completion_tokens(5);
  const Json out = chat.Completion(
      {{0, "Hi", nullptr, "stop"}, {1, "Yo", nullptr, "length"}}, usage);
  EXPECT_EQ(out["object"], "chat.completion");
  ASSERT_EQ(out["choices"].size(), 2u);
  EXPECT_EQ(out["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(out["choices"][0]["message"]["content"], "Hi");
  EXPECT_EQ(out["choices"][1]["finish_reason"], "length");
  EXPECT_TRUE(out["choices"][1]["logprobs"].is_null());
  EXPECT_EQ(out["usage"]["total_tokens"], 8);

  ResponseFormatter text(Request(Endpoint::kCompletion, false, false), "t", 9,
                         FakeBytes);
  EXPECT_EQ(
      text.Completion({{0, "x", nullptr, "stop"}}, usage)["choices"][0]["text"],
      "x");
}

TEST(OpenAiResponseTest, FinishReasons) {
  EXPECT_EQ(FinishReasonName(v1::FINISH_REASON_STOP), "stop");
  EXPECT_EQ(FinishReasonName(v1::FINISH_REASON_LENGTH), "length");
  EXPECT_EQ(FinishReasonName(v1::FINISH_REASON_CANCELLED), "abort");
  EXPECT_EQ(FinishReasonName(v1::FINISH_REASON_ERROR), "error");
}

TEST(OpenAiErrorTest, StatusCodesMapToHttp) {
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kResourceExhausted), 429);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kDeadlineExceeded), 504);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kInternal), 500);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kUnknown), 500);
}

// A Generate call's error about its prompt, in the OpenAI request's names.
TEST(OpenAiErrorTest, PromptErrorsNameTheRequestsFields) {
  struct Case {
    const char* baton;
    const char* field;
    const char* openai;
    const char* param;
  };
  const Case cases[] = {
      {"text: empty text", "prompt[1]", "prompt[1]: empty text", "prompt[1]"},
      {"token_ids.token_ids[3]: 99999 is outside [0, 49152)", "prompt[2]",
       "prompt[2][3]: 99999 is outside [0, 49152)", "prompt[2][3]"},
      {"token_ids.token_ids: at least one id is required", "prompt",
       "prompt: at least one id is required", "prompt"},
      {"chat.messages[0].role: 'tool' is not one of system, user, assistant",
       "messages",
       "messages[0].role: 'tool' is not one of system, user, assistant",
       "messages[0].role"},
      {"prompt.chat.messages: 1025 messages, over the limit of 1024",
       "messages", "messages: 1025 messages, over the limit of 1024",
       "messages"},
      {"prompt.text: 9000000 bytes, over", "prompt",
       "prompt: 9000000 bytes, over", "prompt"},
      {"prompt: 9000 tokens, over", "messages", "messages: 9000 tokens, over",
       "messages"},
      // Not a prompt path: kept.
      {"prompt_tokens + max_tokens must be <= context_length", "prompt",
       "prompt_tokens + max_tokens must be <= context_length", "max_tokens"},
      {"top_p must be in (0, 1], got 2", "prompt",
       "top_p must be in (0, 1], got 2", "top_p"},
      {"sampling.stop: 20 strings, the limit is 16", "prompt",
       "stop: 20 strings, the limit is 16", "stop"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.baton);
    const absl::Status s =
        InRequestTerms(absl::InvalidArgumentError(c.baton), c.field);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), c.openai);
    EXPECT_EQ(ParamOf(s), c.param);
  }
  const absl::Status busy = absl::ResourceExhaustedError("text: busy");
  EXPECT_EQ(InRequestTerms(busy, "prompt"), busy);
}

TEST(OpenAiErrorTest, ErrorBodiesNameTheParam) {
  const HttpError bad = ToHttpError(absl::InvalidArgumentError(
      "sampling.prompt_tokens + max_tokens must be <= context_length, got 5 + "
      "9000 > 8192"));
  EXPECT_EQ(bad.status, 400);
  const Json body = Json::parse(bad.body);
  EXPECT_EQ(body["error"]["param"], "max_tokens");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["code"], "invalid_argument");
  EXPECT_THAT(body["error"]["message"].get<std::string>(),
              ::testing::HasSubstr("context_length"));

  const Json missing = ErrorJson(absl::NotFoundError(
      "model: 'gpt-4' is not served here (served: 'smol')"));
  EXPECT_EQ(missing["error"]["param"], "model");
  EXPECT_EQ(missing["error"]["code"], "model_not_found");

  EXPECT_EQ(ParamOf(absl::InvalidArgumentError("top_p must be in (0, 1]")),
            "top_p");
  EXPECT_EQ(ParamOf(absl::InvalidArgumentError(
                "messages[2].content must be a string")),
            "messages[2].content");
  EXPECT_EQ(ParamOf(absl::InvalidArgumentError("body is not valid JSON")), "");
  EXPECT_EQ(ParamOf(absl::UnavailableError("no decode worker")), "");
  EXPECT_TRUE(
      ErrorJson(absl::UnavailableError("x"))["error"]["param"].is_null());

  const HttpError too_big = MakeHttpError(413, "too big", "request_too_large");
  EXPECT_EQ(too_big.status, 413);
  EXPECT_EQ(Json::parse(too_big.body)["error"]["code"], "request_too_large");
}

}  // namespace
}  // namespace baton::http
