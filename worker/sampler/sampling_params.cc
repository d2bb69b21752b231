#include "worker/sampler/sampling_params.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace baton {
namespace {

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

// `x` in the fewest digits that read back as it (as a float when it is one:
// the API's fields are), so an out-of-range value never prints as the
// bound it is just past ("got 1" for 1.0000001).
std::string Shortest(double x) {
  char buffer[64];
  const float f = static_cast<float>(x);
  const std::to_chars_result r =
      static_cast<double>(f) == x
          ? std::to_chars(buffer, buffer + sizeof(buffer), f)
          : std::to_chars(buffer, buffer + sizeof(buffer), x);
  return std::string(buffer, r.ptr);
}

// Inclusive range check written so that NaN fails it.
bool InClosedRange(double x, double lo, double hi) {
  return x >= lo && x <= hi;
}

}  // namespace

absl::Status ValidateSamplingFields(const SamplingParams& p) {
  if (!(std::isfinite(p.temperature) && p.temperature >= 0.0)) {
    return Invalid(
        absl::StrCat("temperature must be finite and >= 0 (0 = greedy), got ",
                     Shortest(p.temperature)));
  }
  if (p.top_k < 0) {
    return Invalid(absl::StrCat("top_k must be >= 0 (0 = off), got ", p.top_k));
  }
  if (!(p.top_p > 0.0 && p.top_p <= 1.0)) {
    return Invalid(
        absl::StrCat("top_p must be in (0, 1], got ", Shortest(p.top_p)));
  }
  if (!InClosedRange(p.min_p, 0.0, 1.0)) {
    return Invalid(
        absl::StrCat("min_p must be in [0, 1], got ", Shortest(p.min_p)));
  }
  if (!(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0)) {
    return Invalid(absl::StrCat(
        "repetition_penalty must be finite and > 0 (1 = off), got ",
        Shortest(p.repetition_penalty)));
  }
  if (!InClosedRange(p.frequency_penalty, -2.0, 2.0)) {
    return Invalid(absl::StrCat("frequency_penalty must be in [-2, 2], got ",
                                Shortest(p.frequency_penalty)));
  }
  if (!InClosedRange(p.presence_penalty, -2.0, 2.0)) {
    return Invalid(absl::StrCat("presence_penalty must be in [-2, 2], got ",
                                Shortest(p.presence_penalty)));
  }
  if (p.max_tokens < 1) {
    return Invalid(absl::StrCat("max_tokens must be >= 1, got ", p.max_tokens));
  }
  for (size_t i = 0; i < p.stop_token_ids.size(); ++i) {
    if (p.stop_token_ids[i] < 0) {
      return Invalid(absl::StrCat("stop_token_ids[", i, "] must be >= 0, got ",
                                  p.stop_token_ids[i]));
    }
  }
  for (size_t i = 0; i < p.stop.size(); ++i) {
    if (p.stop[i].empty()) {
      return Invalid(absl::StrCat("stop[", i, "] must not be empty"));
    }
  }
  if (p.logprobs.has_value() &&
      (*p.logprobs < 0 || *p.logprobs > kMaxLogprobs)) {
    return Invalid(absl::StrCat("logprobs must be in [0, ", kMaxLogprobs,
                                "] or unset, got ", *p.logprobs));
  }
  if (p.show_probs < 0 || p.show_probs > kMaxLogprobs) {
    return Invalid(absl::StrCat("show_probs must be in [0, ", kMaxLogprobs,
                                "], got ", p.show_probs));
  }
  return absl::OkStatus();
}

absl::Status Validate(const SamplingParams& p, int64_t prompt_tokens,
                      int64_t context_length) {
  if (prompt_tokens == 0) return Invalid("prompt must not be empty");
  if (prompt_tokens < 0) {
    return Invalid(
        absl::StrCat("prompt_tokens must be >= 1, got ", prompt_tokens));
  }
  if (context_length < 1) {
    return Invalid(
        absl::StrCat("context_length must be >= 1, got ", context_length));
  }
  BATON_RETURN_IF_ERROR(ValidateSamplingFields(p));
  if (prompt_tokens + p.max_tokens > context_length) {
    return Invalid(absl::StrCat(
        "prompt_tokens + max_tokens must be <= context_length, got ",
        prompt_tokens, " + ", p.max_tokens, " > ", context_length));
  }
  return absl::OkStatus();
}

bool IsStopToken(const SamplingParams& params, int32_t token,
                 std::span<const int32_t> eos_token_ids) {
  if (std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(),
                token) != params.stop_token_ids.end()) {
    return true;
  }
  return !params.ignore_eos &&
         std::find(eos_token_ids.begin(), eos_token_ids.end(), token) !=
             eos_token_ids.end();
}

}  // namespace baton
