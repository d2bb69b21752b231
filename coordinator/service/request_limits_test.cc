#include "coordinator/service/request_limits.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::coordinator {
namespace {

using ::testing::HasSubstr;

v1::GenerateRequest TextRequest() {
  v1::GenerateRequest r;
  r.set_request_id("client-1");
  r.set_text("Name three rivers.");
  return r;
}

void ExpectRefused(const absl::Status& status, const std::string& message) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr(message));
}

TEST(RequestLimitsTest, DefaultsAdmitAnOrdinaryRequest) {
  v1::GenerateRequest r = TextRequest();
  r.mutable_sampling()->add_stop("\n\n");
  r.mutable_sampling()->add_stop_token_ids(2);
  EXPECT_TRUE(CheckRequestLimits(RequestLimits(), r).ok());
}

TEST(RequestLimitsTest, RequestIdLengthAndControlCharacters) {
  RequestLimits limits;
  v1::GenerateRequest r = TextRequest();
  r.set_request_id(std::string(128, 'x'));
  EXPECT_TRUE(CheckRequestLimits(limits, r).ok());
  r.set_request_id(std::string(129, 'x'));
  ExpectRefused(CheckRequestLimits(limits, r),
                "request_id: 129 bytes, the limit is 128 "
                "(--max_request_id_bytes)");
  r.set_request_id("a\nb");
  ExpectRefused(CheckRequestLimits(limits, r),
                "request_id: control character 0xa at byte 1");
}

TEST(RequestLimitsTest, StopStringsCountBytesEachAndTotal) {
  RequestLimits limits;
  limits.max_stop_strings = 3;
  limits.max_stop_string_bytes = 10;
  limits.max_stop_bytes_total = 25;
  v1::GenerateRequest r = TextRequest();
  for (int i = 0; i < 3; ++i) r.mutable_sampling()->add_stop("0123456789");
  ExpectRefused(CheckRequestLimits(limits, r),
                "sampling.stop: 30 bytes in all, the limit is 25 "
                "(--max_stop_bytes_total)");
  r.mutable_sampling()->set_stop(2, "01234");
  EXPECT_TRUE(CheckRequestLimits(limits, r).ok());
  r.mutable_sampling()->set_stop(1, "0123456789a");
  ExpectRefused(CheckRequestLimits(limits, r),
                "sampling.stop[1]: 11 bytes, the limit is 10");
  r.mutable_sampling()->set_stop(1, "x");
  r.mutable_sampling()->add_stop("y");
  ExpectRefused(CheckRequestLimits(limits, r),
                "sampling.stop: 4 strings, the limit is 3 "
                "(--max_stop_strings)");
}

TEST(RequestLimitsTest, StopTokenIds) {
  RequestLimits limits;
  limits.max_stop_token_ids = 2;
  v1::GenerateRequest r = TextRequest();
  for (int i = 0; i < 3; ++i) r.mutable_sampling()->add_stop_token_ids(i);
  ExpectRefused(CheckRequestLimits(limits, r),
                "sampling.stop_token_ids: 3 ids, the limit is 2");
}

TEST(RequestLimitsTest, PromptBytesMessagesAndTokens) {
  RequestLimits limits;
  limits.max_prompt_bytes = 10;
  limits.max_chat_messages = 2;
  limits.max_prompt_tokens = 4;
  v1::GenerateRequest r = TextRequest();
  ExpectRefused(CheckRequestLimits(limits, r),
                "prompt.text: 18 bytes, the limit is 10");
  r.mutable_chat()->add_messages()->set_content("hi");
  r.mutable_chat()->mutable_messages(0)->set_role("user");
  EXPECT_TRUE(CheckRequestLimits(limits, r).ok());
  r.mutable_chat()->add_messages()->set_content("hello");
  ExpectRefused(CheckRequestLimits(limits, r),
                "prompt.chat: 11 bytes, the limit is 10");
  r.mutable_chat()->add_messages();
  ExpectRefused(CheckRequestLimits(limits, r),
                "prompt.chat.messages: 3 messages, the limit is 2");
  for (int i = 0; i < 5; ++i) r.mutable_token_ids()->add_token_ids(i);
  ExpectRefused(CheckRequestLimits(limits, r),
                "prompt: 5 tokens, the limit is 4 (--max_prompt_tokens)");
  EXPECT_TRUE(CheckPromptTokens(limits, 4).ok());
  limits.max_prompt_tokens = 0;  // the model's context decides
  EXPECT_TRUE(CheckPromptTokens(limits, 100000).ok());
}

}  // namespace
}  // namespace baton::coordinator
