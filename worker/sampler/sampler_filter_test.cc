// Statistical and reference checks of temperature, top-k, top-p and min-p.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/sampler/sampler.h"

namespace baton {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::unique_ptr<RequestSampler> MakeSampler(const SamplingParams& params) {
  auto sampler = RequestSampler::Create(params, {});
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

// Reference of the filtered distribution: full sort, no laziness.
// Returns p[vocab]; 0 for filtered-out tokens.
std::vector<double> ReferenceDistribution(const std::vector<float>& z,
                                          const SamplingParams& p) {
  const size_t n = z.size();
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return z[a] > z[b] || (z[a] == z[b] && a < b);
  });
  const double z_max = z[order[0]];
  std::vector<double> w(n);
  for (size_t i = 0; i < n; ++i) {
    w[i] = std::exp((z[order[i]] - z_max) / p.temperature);
  }
  size_t keep = n;
  if (p.top_k > 0) keep = std::min<size_t>(keep, p.top_k);
  const double total = std::accumulate(w.begin(), w.begin() + keep, 0.0);
  if (p.top_p < 1.0) {
    double before = 0.0;
    size_t i = 0;
    while (i < keep && before < p.top_p * total) before += w[i++];
    keep = i;
  }
  size_t min_p_keep = 0;
  while (min_p_keep < keep && w[min_p_keep] >= p.min_p * w[0]) ++min_p_keep;
  keep = min_p_keep;
  const double kept = std::accumulate(w.begin(), w.begin() + keep, 0.0);
  std::vector<double> dist(n, 0.0);
  for (size_t i = 0; i < keep; ++i) dist[order[i]] = w[i] / kept;
  return dist;
}

struct FilterCase {
  const char* name;
  double temperature;
  int32_t top_k;
  double top_p;
  double min_p;
};

TEST(SamplerFilterTest, EmpiricalFrequenciesMatchFilteredDistribution) {
  const std::vector<float> logits = {2.0f, 1.5f,  1.0f,  0.5f,  1.5f,
                                     0.0f, -0.5f, -1.0f, -3.0f, 0.25f};
  const FilterCase cases[] = {
      {"temperature only", 0.7, 0, 1.0, 0.0},
      {"hot", 2.0, 0, 1.0, 0.0},
      {"top_k", 1.0, 3, 1.0, 0.0},
      {"top_p", 1.0, 0, 0.8, 0.0},
      {"min_p", 1.0, 0, 1.0, 0.3},
      {"all", 0.8, 6, 0.9, 0.1},
  };
  constexpr int kDraws = 20000;
  for (const FilterCase& c : cases) {
    SCOPED_TRACE(c.name);
    SamplingParams params;
    params.temperature = c.temperature;
    params.top_k = c.top_k;
    params.top_p = c.top_p;
    params.min_p = c.min_p;
    params.seed = 20240601;
    params.show_probs = 20;
    const std::vector<double> expected = ReferenceDistribution(logits, params);
    auto sampler = MakeSampler(params);
    std::vector<int> counts(logits.size(), 0);
    for (int i = 0; i < kDraws; ++i) {
      auto result = sampler->Sample(logits);
      ASSERT_TRUE(result.ok()) << result.status();
      if (i == 0) {
        // The processed distribution equals the reference exactly.
        size_t kept = 0;
        for (double e : expected) kept += e > 0.0;
        ASSERT_EQ(result->processed.size(), kept);
        for (const TokenProb& tp : result->processed) {
          EXPECT_NEAR(tp.prob, expected[tp.token], 1e-6);
        }
      }
      ++counts[result->token];
      sampler->Accept(result->token);
    }
    int filtered_out = 0;
    for (size_t t = 0; t < logits.size(); ++t) {
      const double p = expected[t];
      if (p == 0.0) {
        ++filtered_out;
        EXPECT_EQ(counts[t], 0) << "token " << t << " was filtered out";
        continue;
      }
      const double freq = static_cast<double>(counts[t]) / kDraws;
      const double se = std::sqrt(p * (1.0 - p) / kDraws);
      EXPECT_NEAR(freq, p, 4.0 * se) << "token " << t;
    }
    if (c.top_k > 0 || c.top_p < 1.0 || c.min_p > 0.0) {
      EXPECT_GT(filtered_out, 0);
    }
  }
}

TEST(SamplerFilterTest, MaskedTokensAreNeverDrawn) {
  SamplingParams params;
  params.temperature = 5.0;
  params.seed = 1;
  auto sampler = MakeSampler(params);
  std::vector<float> logits(64, 0.0f);
  for (size_t i = 0; i < logits.size(); i += 2) logits[i] = kNegInf;
  for (int i = 0; i < 2000; ++i) {
    const int32_t token = sampler->Sample(logits)->token;
    ASSERT_EQ(token % 2, 1);
    sampler->Accept(token);
  }
}

TEST(SamplerFilterTest, LargeVocabMatchesReferenceFilters) {
  std::mt19937_64 rng(2024);
  const FilterCase cases[] = {
      {"top_k 10", 1.0, 10, 1.0, 0.0},
      {"top_k 50 top_p", 0.8, 50, 0.9, 0.0},
      {"top_p 0.5", 1.0, 0, 0.5, 0.0},
      {"top_p 0.99 hot", 1.5, 0, 0.99, 0.0},
      {"min_p", 1.0, 0, 1.0, 0.05},
      {"all", 0.7, 100, 0.95, 0.02},
      {"top_k above vocab", 1.0, 1 << 20, 1.0, 0.0},
  };
  for (const FilterCase& c : cases) {
    SCOPED_TRACE(c.name);
    SamplingParams params;
    params.temperature = c.temperature;
    params.top_k = c.top_k;
    params.top_p = c.top_p;
    params.min_p = c.min_p;
    params.show_probs = 20;
    params.seed = 77;
    auto sampler = MakeSampler(params);
    for (int trial = 0; trial < 5; ++trial) {
      std::vector<float> logits = RandomLogits(rng, 152064, 3.0f);
      // Ties in the head exercise the id tie-break.
      logits[100] = logits[200] = 14.0f;
      const std::vector<double> expected =
          ReferenceDistribution(logits, params);
      std::vector<int32_t> kept_order;
      for (int32_t t = 0; t < static_cast<int32_t>(expected.size()); ++t) {
        if (expected[t] > 0.0) kept_order.push_back(t);
      }
      std::sort(kept_order.begin(), kept_order.end(),
                [&](int32_t a, int32_t b) {
                  return expected[a] > expected[b] ||
                         (expected[a] == expected[b] && a < b);
                });
      auto result = sampler->Sample(logits);
      ASSERT_TRUE(result.ok());
      EXPECT_GT(expected[result->token], 0.0);
      ASSERT_EQ(result->processed.size(),
                std::min<size_t>(20, kept_order.size()));
      for (size_t i = 0; i < result->processed.size(); ++i) {
        EXPECT_EQ(result->processed[i].token, kept_order[i]);
        EXPECT_NEAR(result->processed[i].prob, expected[kept_order[i]], 1e-6);
      }
      sampler->Accept(result->token);
    }
  }
}

// Draws n tokens and returns their counts over the vocabulary.
std::vector<int> Draw(const SamplingParams& params,
                      const std::vector<float>& logits, int n) {
  auto sampler = MakeSampler(params);
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < n; ++i) {
    auto result = sampler->Sample(logits);
    EXPECT_TRUE(result.ok()) << result.status();
    ++counts[result->token];
    sampler->Accept(result->token);
  }
  return counts;
}

TEST(SamplerFilterTest, ExtremeInputs) {
  constexpr int kDraws = 10000;
  SamplingParams params;
  params.seed = 9;
  {
    SCOPED_TRACE("all logits equal, top_k 10: the 10 lowest ids, uniform");
    params.top_k = 10;
    const std::vector<int> counts =
        Draw(params, std::vector<float>(1000, 0.5f), kDraws);
    for (int t = 0; t < 1000; ++t) {
      if (t < 10) {
        EXPECT_NEAR(counts[t], kDraws / 10, 4 * std::sqrt(kDraws * 0.09));
      } else {
        ASSERT_EQ(counts[t], 0) << t;
      }
    }
    params.top_k = 0;
  }
  {
    SCOPED_TRACE("temperature 1e-30: only the two tied maxima, half each");
    params.temperature = 1e-30;
    std::vector<float> logits(300, 0.0f);
    logits[7] = logits[3] = 2.0f;
    logits[5] = 2.0f - 1e-6f;
    const std::vector<int> counts = Draw(params, logits, kDraws);
    EXPECT_EQ(counts[3] + counts[7], kDraws);
    EXPECT_NEAR(counts[3], kDraws / 2, 4 * std::sqrt(kDraws * 0.25));
  }
  {
    SCOPED_TRACE("temperature 1e6: uniform");
    params.temperature = 1e6;
    std::mt19937_64 rng(1);
    const std::vector<int> counts =
        Draw(params, RandomLogits(rng, 100, 3.0f), kDraws);
    for (int c : counts) {
      EXPECT_NEAR(c, kDraws / 100, 5 * std::sqrt(kDraws * 0.0099));
    }
  }
  {
    SCOPED_TRACE("one huge logit and an extreme low one");
    params.temperature = 1.0;
    const std::vector<float> logits = {0.0f, 3e38f, -3e38f, kNegInf, 1.0f};
    EXPECT_EQ(Draw(params, logits, 200)[1], 200);
  }
}

}  // namespace
}  // namespace baton
