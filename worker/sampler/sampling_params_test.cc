#include "worker/sampler/sampling_params.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

struct BadCase {
  std::string name;
  std::function<void(SamplingParams&)> mutate;
  // Substrings the message must contain: the field and the allowed range.
  std::string field;
  std::string range;
};

TEST(SamplingParamsTest, DefaultsAreValid) {
  EXPECT_TRUE(Validate(SamplingParams{}, 10, 2048).ok());
  SamplingParams p;
  EXPECT_EQ(p.temperature, 1.0);
  EXPECT_EQ(p.top_k, 0);
  EXPECT_EQ(p.top_p, 1.0);
  EXPECT_EQ(p.min_p, 0.0);
  EXPECT_EQ(p.repetition_penalty, 1.0);
  EXPECT_EQ(p.max_tokens, 16);
  EXPECT_FALSE(p.seed.has_value());
  EXPECT_FALSE(p.logprobs.has_value());
}

TEST(SamplingParamsTest, BoundaryValuesAreValid) {
  SamplingParams p;
  p.temperature = 0.0;
  p.top_k = 1;
  p.top_p = 1e-9;
  p.min_p = 1.0;
  p.repetition_penalty = 1e-3;
  p.frequency_penalty = -2.0;
  p.presence_penalty = 2.0;
  p.max_tokens = 1;
  p.logprobs = 0;
  p.show_probs = 20;
  p.stop = {"x"};
  EXPECT_TRUE(Validate(p, 1, 2).ok());
  p.logprobs = 20;
  p.min_p = 0.0;
  p.top_p = 1.0;
  EXPECT_TRUE(Validate(p, 1, 2).ok());
}

TEST(SamplingParamsTest, RejectsEveryBadFieldNamingFieldAndRange) {
  const std::vector<BadCase> cases = {
      {"negative temperature", [](auto& p) { p.temperature = -0.1; },
       "temperature", ">= 0"},
      {"nan temperature", [](auto& p) { p.temperature = kNaN; }, "temperature",
       "finite"},
      {"inf temperature", [](auto& p) { p.temperature = kInf; }, "temperature",
       "finite"},
      {"top_p zero", [](auto& p) { p.top_p = 0.0; }, "top_p", "(0, 1]"},
      {"top_p above one", [](auto& p) { p.top_p = 1.5; }, "top_p", "(0, 1]"},
      {"top_p nan", [](auto& p) { p.top_p = kNaN; }, "top_p", "(0, 1]"},
      {"top_k negative", [](auto& p) { p.top_k = -1; }, "top_k", ">= 0"},
      {"min_p negative", [](auto& p) { p.min_p = -0.01; }, "min_p", "[0, 1]"},
      {"min_p above one", [](auto& p) { p.min_p = 1.01; }, "min_p", "[0, 1]"},
      {"min_p nan", [](auto& p) { p.min_p = kNaN; }, "min_p", "[0, 1]"},
      {"repetition zero", [](auto& p) { p.repetition_penalty = 0.0; },
       "repetition_penalty", "> 0"},
      {"repetition negative", [](auto& p) { p.repetition_penalty = -1.0; },
       "repetition_penalty", "> 0"},
      {"repetition inf", [](auto& p) { p.repetition_penalty = kInf; },
       "repetition_penalty", "finite"},
      {"frequency low", [](auto& p) { p.frequency_penalty = -2.5; },
       "frequency_penalty", "[-2, 2]"},
      {"frequency high", [](auto& p) { p.frequency_penalty = 2.01; },
       "frequency_penalty", "[-2, 2]"},
      {"presence low", [](auto& p) { p.presence_penalty = -3.0; },
       "presence_penalty", "[-2, 2]"},
      {"presence nan", [](auto& p) { p.presence_penalty = kNaN; },
       "presence_penalty", "[-2, 2]"},
      {"max_tokens zero", [](auto& p) { p.max_tokens = 0; }, "max_tokens",
       ">= 1"},
      {"logprobs negative", [](auto& p) { p.logprobs = -1; }, "logprobs",
       "[0, 20]"},
      {"logprobs above 20", [](auto& p) { p.logprobs = 21; }, "logprobs",
       "[0, 20]"},
      {"show_probs above 20", [](auto& p) { p.show_probs = 21; }, "show_probs",
       "[0, 20]"},
      {"empty stop",
       [](auto& p) {
         p.stop = {"ok", ""};
       },
       "stop[1]", "must not be empty"},
      {"negative stop token",
       [](auto& p) {
         p.stop_token_ids = {3, -2};
       },
       "stop_token_ids[1]", ">= 0"},
  };
  for (const BadCase& c : cases) {
    SamplingParams p;
    c.mutate(p);
    const absl::Status s = Validate(p, 10, 2048);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(s.message()),
                AllOf(HasSubstr(c.field), HasSubstr(c.range)))
        << c.name;
    EXPECT_EQ(ValidateSamplingFields(p).code(),
              absl::StatusCode::kInvalidArgument)
        << c.name;
  }
}

// A value just past a bound prints as itself, never as the bound (the API's
// fields are floats: 1.0000001f is the float after 1).
TEST(SamplingParamsTest, AValueJustPastABoundPrintsAsItself) {
  SamplingParams p;
  p.top_p = static_cast<double>(1.0000001f);
  EXPECT_THAT(std::string(ValidateSamplingFields(p).message()),
              HasSubstr("got 1.0000001"));
  p = SamplingParams();
  p.presence_penalty = static_cast<double>(2.0000002f);
  EXPECT_THAT(std::string(ValidateSamplingFields(p).message()),
              HasSubstr("got 2.0000002"));
  p = SamplingParams();
  p.min_p = 1.0 + 1e-12;  // not a float: all the digits it takes
  EXPECT_THAT(std::string(ValidateSamplingFields(p).message()),
              HasSubstr("got 1.000000000001"));
  p = SamplingParams();
  p.temperature = -0.5;
  EXPECT_THAT(std::string(ValidateSamplingFields(p).message()),
              HasSubstr("got -0.5"));
}

TEST(SamplingParamsTest, RejectsPromptPlusMaxTokensBeyondContext) {
  SamplingParams p;
  p.max_tokens = 50;
  EXPECT_TRUE(Validate(p, 78, 128).ok());
  const absl::Status s = Validate(p, 100, 128);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("context_length"), HasSubstr("100"),
                    HasSubstr("50"), HasSubstr("128")));
}

TEST(SamplingParamsTest, RejectsEmptyPrompt) {
  const absl::Status s = Validate(SamplingParams{}, 0, 128);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("prompt must not be empty"));
  EXPECT_EQ(Validate(SamplingParams{}, -1, 128).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SamplingParamsTest, StopTokens) {
  SamplingParams p;
  p.stop_token_ids = {7};
  const std::vector<int32_t> eos = {2};
  EXPECT_TRUE(IsStopToken(p, 7, eos));
  EXPECT_TRUE(IsStopToken(p, 2, eos));
  EXPECT_FALSE(IsStopToken(p, 3, eos));
  p.ignore_eos = true;
  EXPECT_FALSE(IsStopToken(p, 2, eos));
  EXPECT_TRUE(IsStopToken(p, 7, eos));
}

}  // namespace
}  // namespace baton
