#include "worker/sampler/sampler.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::unique_ptr<RequestSampler> MakeSampler(const SamplingParams& params,
                                            std::vector<int32_t> prompt = {}) {
  auto sampler = RequestSampler::Create(params, prompt);
  EXPECT_TRUE(sampler.ok()) << sampler.status();
  return std::move(sampler).value();
}

std::vector<float> RandomLogits(std::mt19937_64& rng, size_t vocab,
                                float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> logits(vocab);
  for (float& v : logits) v = normal(rng);
  return logits;
}

TEST(SamplerTest, GreedyIsArgmaxOfPenalizedLogitsWithLowestIdOnTies) {
  SamplingParams params;
  params.temperature = 0.0;
  auto sampler = MakeSampler(params);
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    const std::vector<float> logits = RandomLogits(rng, 1000, 3.0f);
    auto result = sampler->Sample(logits);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->token,
              std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  std::vector<float> ties = {0.0f, 1.0f, 0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(sampler->Sample(ties)->token, 3);

  // Penalties apply before greedy: token 3 repeated loses to token 5.
  params.repetition_penalty = 1.5;
  auto penalized = MakeSampler(params, {3});
  EXPECT_EQ(penalized->Sample(ties)->token, 5);
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDifferentTokens) {
  SamplingParams params;
  params.temperature = 0.9;
  params.top_p = 0.95;
  params.repetition_penalty = 1.1;
  auto run = [&](uint64_t seed, bool interleave) {
    SamplingParams p = params;
    p.seed = seed;
    auto a = MakeSampler(p, {1, 2, 3});
    SamplingParams other_params = params;
    other_params.seed = seed + 1000;
    auto other = MakeSampler(other_params, {4});
    std::mt19937_64 logits_rng(99);
    std::vector<int32_t> tokens;
    for (int step = 0; step < 200; ++step) {
      const std::vector<float> logits = RandomLogits(logits_rng, 500, 2.0f);
      if (interleave) other->Accept(other->Sample(logits)->token);
      auto first = a->Sample(logits);
      auto again = a->Sample(logits);  // Sample alone changes nothing.
      EXPECT_EQ(first->token, again->token);
      tokens.push_back(first->token);
      a->Accept(first->token);
    }
    return tokens;
  };
  const std::vector<int32_t> base = run(1234, false);
  EXPECT_EQ(run(1234, false), base);
  EXPECT_EQ(run(1234, true), base);  // Batch neighbours do not matter.
  const std::vector<int32_t> other = run(1235, false);
  int differing = 0;
  for (size_t i = 0; i < base.size(); ++i) differing += base[i] != other[i];
  EXPECT_GT(differing, 100);
}

TEST(SamplerTest, RebuiltSamplerContinuesTheStream) {
  SamplingParams params;  // Unseeded: the seed is drawn at creation.
  auto first = MakeSampler(params, {5, 6});
  auto second = MakeSampler(params, {5, 6});
  EXPECT_NE(first->seed(), second->seed());
  std::mt19937_64 rng(3);
  const std::vector<float> logits0 = RandomLogits(rng, 300, 1.0f);
  const std::vector<float> logits1 = RandomLogits(rng, 300, 1.0f);
  const int32_t t0 = first->Sample(logits0)->token;
  first->Accept(t0);
  const int32_t t1 = first->Sample(logits1)->token;

  params.seed = first->seed();
  auto rebuilt = MakeSampler(params, {5, 6});
  rebuilt->Accept(t0);
  EXPECT_EQ(rebuilt->num_generated(), 1);
  EXPECT_EQ(rebuilt->Sample(logits1)->token, t1);
}

TEST(SamplerTest, PenaltiesChangeLogitsAsDefined) {
  SamplingParams params;
  params.repetition_penalty = 2.0;
  params.frequency_penalty = 0.5;
  params.presence_penalty = 0.25;
  auto sampler = MakeSampler(params, /*prompt=*/{0, 1, 0});
  sampler->Accept(2);
  sampler->Accept(2);
  sampler->Accept(3);
  std::vector<float> logits = {2.0f, -1.0f, 0.5f, -0.5f, 3.0f, 1.0f, kNegInf};
  const std::vector<float> raw = logits;
  sampler->ApplyPenalties(logits);
  // Prompt only: repetition. Output: repetition, then 0.5 * count + 0.25.
  const std::vector<float> expected = {1.0f, -2.0f, -1.0f,  -1.75f,
                                       3.0f, 1.0f,  kNegInf};
  EXPECT_EQ(logits, expected);

  // Sample sees the same penalized logits: processed probs at T = 1.
  SamplingParams show = params;
  show.show_probs = 7;
  auto shower = MakeSampler(show, {0, 1, 0});
  for (int32_t t : {2, 2, 3}) shower->Accept(t);
  auto result = shower->Sample(raw);
  ASSERT_TRUE(result.ok());
  double total = 0.0;
  for (size_t i = 0; i < 6; ++i) total += std::exp(expected[i]);
  ASSERT_EQ(result->processed.size(), 6u);  // The masked token is no candidate.
  EXPECT_EQ(result->processed[0].token, 4);
  for (const TokenProb& tp : result->processed) {
    EXPECT_NEAR(tp.prob, std::exp(expected[tp.token]) / total, 1e-6);
  }

  // Without penalties nothing changes.
  auto plain = MakeSampler(SamplingParams{}, {0, 1});
  std::vector<float> same = raw;
  plain->Accept(2);
  plain->ApplyPenalties(same);
  EXPECT_EQ(same, raw);
}

TEST(SamplerTest, LogprobsComeFromRawLogits) {
  std::mt19937_64 rng(11);
  const std::vector<float> logits = RandomLogits(rng, 49152, 4.0f);
  double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float v : logits) sum += std::exp(v - max);
  const double lse = max + std::log(sum);
  std::vector<int32_t> by_logit(logits.size());
  std::iota(by_logit.begin(), by_logit.end(), 0);
  std::stable_sort(by_logit.begin(), by_logit.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });

  SamplingParams params;
  params.temperature = 0.5;
  params.repetition_penalty = 1.3;
  params.logprobs = 5;
  params.seed = 5;
  auto sampler = MakeSampler(params, {by_logit[0], by_logit[1]});
  for (int step = 0; step < 20; ++step) {
    auto result = sampler->Sample(logits);
    ASSERT_TRUE(result.ok());
    ASSERT_TRUE(result->logprob.has_value());
    EXPECT_NEAR(*result->logprob, logits[result->token] - lse, 1e-6);
    ASSERT_EQ(result->top_logprobs.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(result->top_logprobs[i].token, by_logit[i]);
      EXPECT_NEAR(result->top_logprobs[i].logprob, logits[by_logit[i]] - lse,
                  1e-6);
      if (i > 0) {
        EXPECT_GE(result->top_logprobs[i - 1].logprob,
                  result->top_logprobs[i].logprob);
      }
    }
    sampler->Accept(result->token);
  }

  params.logprobs = 0;
  auto chosen_only = MakeSampler(params)->Sample(logits);
  EXPECT_TRUE(chosen_only->logprob.has_value());
  EXPECT_TRUE(chosen_only->top_logprobs.empty());
  params.logprobs.reset();
  auto none = MakeSampler(params)->Sample(logits);
  EXPECT_FALSE(none->logprob.has_value());
  EXPECT_TRUE(none->top_logprobs.empty());
}

TEST(SamplerTest, RejectsBadLogits) {
  auto sampler = MakeSampler(SamplingParams{}, {10});
  std::vector<float> logits(16, 0.0f);
  EXPECT_TRUE(sampler->Sample(logits).ok());
  EXPECT_EQ(sampler->Sample({}).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> bad = logits;
  bad[3] = std::numeric_limits<float>::quiet_NaN();
  auto nan = sampler->Sample(bad);
  EXPECT_EQ(nan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(nan.status().message()), HasSubstr("logits[3]"));
  bad[3] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(sampler->Sample(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> masked(16, kNegInf);
  EXPECT_THAT(std::string(sampler->Sample(masked).status().message()),
              HasSubstr("no finite"));
  std::vector<float> small(8, 0.0f);  // Prompt token 10 is outside.
  EXPECT_THAT(std::string(sampler->Sample(small).status().message()),
              HasSubstr("token id 10"));
}

TEST(SamplerTest, CreateRejectsBadParamsAndPrompt) {
  SamplingParams params;
  params.top_p = 0.0;
  std::vector<int32_t> prompt = {1};
  EXPECT_EQ(RequestSampler::Create(params, prompt).status().code(),
            absl::StatusCode::kInvalidArgument);
  prompt = {1, -4};
  auto bad = RequestSampler::Create(SamplingParams{}, prompt);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("prompt[1]"));
}

double ThreadCpuMicros() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

// Prints per-call CPU cost at Qwen-sized vocab; asserts only the tokens are
// valid.
TEST(SamplerTest, CostAtLargeVocab) {
  std::mt19937_64 rng(8);
  const std::vector<float> logits = RandomLogits(rng, 152064, 3.0f);
  struct CostCase {
    const char* name;
    double temperature;
    int32_t top_k;
    double top_p;
    double min_p;
  };
  const CostCase cases[] = {{"greedy", 0.0, 0, 1.0, 0.0},
                            {"temperature", 0.8, 0, 1.0, 0.0},
                            {"top_k 50", 0.8, 50, 1.0, 0.0},
                            {"top_p 0.9", 0.8, 0, 0.9, 0.0},
                            {"min_p 0.05", 0.8, 0, 1.0, 0.05}};
  for (const CostCase& c : cases) {
    SamplingParams params;
    params.temperature = c.temperature;
    params.top_k = c.top_k;
    params.top_p = c.top_p;
    params.min_p = c.min_p;
    params.seed = 1;
    auto sampler = MakeSampler(params);
    constexpr int kCalls = 50;
    const double start = ThreadCpuMicros();
    for (int i = 0; i < kCalls; ++i) {
      auto result = sampler->Sample(logits);
      ASSERT_TRUE(result.ok());
      ASSERT_GE(result->token, 0);
      sampler->Accept(result->token);
    }
    const double us = (ThreadCpuMicros() - start) / kCalls;
    std::printf("[ cost ] %-12s %8.1f us/sample (vocab 152064)\n", c.name, us);
  }
}

}  // namespace
}  // namespace baton
