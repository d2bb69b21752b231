#include "worker/sampler/sampler.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "worker/sampler/candidate_list.h"

namespace baton {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Vocabulary-sized scratch, one per thread so that requests hold none.
struct Workspace {
  // Penalized logits, [vocab]; used only when the request has penalties.
  std::vector<float> z;
  sampler_internal::CandidateList candidates;
};

Workspace& ThreadWorkspace() {
  thread_local Workspace workspace;
  return workspace;
}

// Output n of the SplitMix64 stream seeded with `seed`.
uint64_t SplitMix64(uint64_t seed, uint64_t n) {
  uint64_t x = seed + (n + 1) * 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Strict total order "more likely first": value descending, then id
// ascending.
struct MoreLikely {
  const float* values;
  bool operator()(int32_t a, int32_t b) const {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  }
};

// Ids of the n largest `values` in MoreLikely order (fewer if values is
// shorter). O(values.size() * n) worst case, ~O(values.size()) in practice.
std::vector<int32_t> TopN(std::span<const float> values, size_t n) {
  n = std::min(n, values.size());
  std::vector<int32_t> top;
  top.reserve(n + 1);
  if (n == 0) return top;
  const MoreLikely more{values.data()};
  for (int32_t i = 0; i < static_cast<int32_t>(values.size()); ++i) {
    if (top.size() == n && !more(i, top.back())) continue;
    top.insert(std::upper_bound(top.begin(), top.end(), i, more), i);
    if (top.size() > n) top.pop_back();
  }
  return top;
}

// log(sum(exp(values))) over the finite entries. REQUIRES: one is finite.
double LogSumExp(std::span<const float> values) {
  float max = kNegInf;
  for (float v : values) max = std::max(max, v);
  double sum = 0.0;
  for (float v : values) sum += std::exp(static_cast<double>(v) - max);
  return max + std::log(sum);
}

}  // namespace

absl::StatusOr<std::unique_ptr<RequestSampler>> RequestSampler::Create(
    const SamplingParams& params, std::span<const int32_t> prompt) {
  BATON_RETURN_IF_ERROR(ValidateSamplingFields(params));
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt[", i, "] must be >= 0, got ", prompt[i]));
    }
  }
  uint64_t seed = 0;
  if (params.seed.has_value()) {
    seed = *params.seed;
  } else {
    std::random_device device;
    seed = (static_cast<uint64_t>(device()) << 32) ^ device();
  }
  std::unique_ptr<RequestSampler> sampler(new RequestSampler(params, seed));
  for (int32_t token : prompt) {
    sampler->max_token_id_ = std::max(sampler->max_token_id_, token);
    if (sampler->has_penalties_) sampler->stats_[token].in_prompt = true;
  }
  return sampler;
}

RequestSampler::RequestSampler(const SamplingParams& params, uint64_t seed)
    : params_(params),
      seed_(seed),
      has_penalties_(params.repetition_penalty != 1.0 ||
                     params.frequency_penalty != 0.0 ||
                     params.presence_penalty != 0.0) {}

void RequestSampler::Accept(int32_t token) {
  BATON_CHECK_GE(token, 0);
  ++num_generated_;
  max_token_id_ = std::max(max_token_id_, token);
  if (has_penalties_) ++stats_[token].generated;
}

double RequestSampler::Uniform() const {
  return static_cast<double>(
             SplitMix64(seed_, static_cast<uint64_t>(num_generated_)) >> 11) *
         0x1.0p-53;
}

void RequestSampler::ApplyPenalties(std::span<float> logits) const {
  if (!has_penalties_) return;
  const double rep = params_.repetition_penalty;
  for (const auto& [token, stats] : stats_) {
    BATON_CHECK_LT(static_cast<size_t>(token), logits.size());
    float& logit = logits[token];
    if (!std::isfinite(logit)) continue;
    double v = logit;
    v = v > 0.0 ? v / rep : v * rep;
    if (stats.generated > 0) {
      v -= params_.frequency_penalty * stats.generated;
      v -= params_.presence_penalty;
    }
    // A finite logit stays finite (and so drawable) whatever the penalty.
    logit =
        static_cast<float>(std::clamp(v, -double{FLT_MAX}, double{FLT_MAX}));
  }
}

absl::StatusOr<SampleResult> RequestSampler::Sample(
    std::span<const float> logits) const {
  if (logits.empty()) return absl::InvalidArgumentError("logits is empty");
  if (static_cast<int64_t>(logits.size()) <= max_token_id_) {
    return absl::InvalidArgumentError(
        absl::StrCat("logits has ", logits.size(), " entries but token id ",
                     max_token_id_, " is in the prompt or output"));
  }
  bool any_finite = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    if (std::isnan(v) || v == std::numeric_limits<float>::infinity()) {
      return absl::InvalidArgumentError(
          absl::StrCat("logits[", i, "] is ", v, "; must be finite or -inf"));
    }
    any_finite |= v != kNegInf;
  }
  if (!any_finite) {
    return absl::InvalidArgumentError("logits has no finite entry");
  }

  Workspace& ws = ThreadWorkspace();
  std::span<const float> z = logits;  // Penalized logits.
  if (has_penalties_) {
    ws.z.assign(logits.begin(), logits.end());
    ApplyPenalties(ws.z);
    z = ws.z;
  }

  SampleResult result;
  const size_t show = static_cast<size_t>(params_.show_probs);
  if (params_.temperature == 0.0) {
    const std::vector<int32_t> top = TopN(z, std::max<size_t>(show, 1));
    result.token = top[0];
    if (show > 0) {
      const double lse = LogSumExp(z);
      for (int32_t t : top) {
        result.processed.push_back(
            {t, static_cast<float>(std::exp(z[t] - lse))});
      }
    }
  } else {
    sampler_internal::CandidateList& cand = ws.candidates;
    cand.Build(z, params_.temperature,
               static_cast<size_t>(std::max(params_.top_k, 0)));
    // Top-p keeps position i iff the mass strictly before it is < top_p.
    if (params_.top_p < 1.0) {
      const size_t last =
          cand.FirstPositionCrossing(params_.top_p * cand.total(), true);
      cand.Truncate(last + 1);
    }
    // Min-p: the best candidate has weight 1 and min_p <= 1, so it stays.
    if (params_.min_p > 0.0) {
      cand.Truncate(cand.CountWeightAtLeast(params_.min_p));
    }
    const size_t chosen =
        cand.FirstPositionCrossing(Uniform() * cand.total(), false);
    result.token = cand.TokenAt(chosen);
    for (size_t i = 0; i < std::min(show, cand.size()); ++i) {
      result.processed.push_back(
          {cand.TokenAt(i),
           static_cast<float>(cand.WeightAt(i) / cand.total())});
    }
  }

  if (params_.logprobs.has_value()) {
    const double lse = LogSumExp(logits);
    result.logprob = static_cast<float>(logits[result.token] - lse);
    for (int32_t t : TopN(logits, static_cast<size_t>(*params_.logprobs))) {
      result.top_logprobs.push_back({t, static_cast<float>(logits[t] - lse)});
    }
  }
  return result;
}

}  // namespace baton
