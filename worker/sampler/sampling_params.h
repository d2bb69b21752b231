// Per-request sampling parameters with vLLM's meanings, and their validation.
#ifndef BATON_WORKER_SAMPLER_SAMPLING_PARAMS_H_
#define BATON_WORKER_SAMPLER_SAMPLING_PARAMS_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace baton {

// Largest number of alternatives `logprobs` and `show_probs` may ask for.
inline constexpr int32_t kMaxLogprobs = 20;

struct SamplingParams {
  // --- Distribution -------------------------------------------------------
  // Divides the penalized logits; 0 means greedy (argmax, ties to the lowest
  // token id). Must be finite and >= 0.
  double temperature = 1.0;
  // Keeps the k most likely tokens (ties broken by lower token id); 0 turns
  // top-k off, as does any k >= vocabulary size. Negative is invalid.
  int32_t top_k = 0;
  // Keeps the smallest most-likely-first prefix whose probability mass
  // reaches top_p; in (0, 1], 1 turns top-p off.
  double top_p = 1.0;
  // Drops tokens whose probability is below min_p times the most likely
  // token's probability; in [0, 1], 0 turns min-p off.
  double min_p = 0.0;
  // For every token in the prompt or the output so far: positive logits are
  // divided by it, negative ones multiplied. > 0, 1 turns it off.
  double repetition_penalty = 1.0;
  // Subtracted from a token's logit once per occurrence in the output so far
  // (not the prompt). In [-2, 2].
  double frequency_penalty = 0.0;
  // Subtracted once from the logit of every token present in the output so
  // far (not the prompt). In [-2, 2].
  double presence_penalty = 0.0;
  // Seed of the request's random stream: the same seed, prompt and logits
  // give the same tokens whatever else is in the batch. Unset: a seed is
  // drawn from std::random_device when the request's sampler is created.
  std::optional<uint64_t> seed;

  // --- Termination --------------------------------------------------------
  // Most tokens to generate; >= 1, and prompt + max_tokens must fit the
  // model's context.
  int32_t max_tokens = 16;
  // Generating any of these ends the request (even with ignore_eos); the
  // token is part of the output, as in vLLM.
  std::vector<int32_t> stop_token_ids;
  // Generation ends right before the first occurrence of any of these in the
  // output text; the stop string itself is not returned. None may be empty.
  std::vector<std::string> stop;
  // Keep generating past the model's end-of-sequence token(s).
  bool ignore_eos = false;

  // --- Reporting ----------------------------------------------------------
  // Unset: no logprobs. N in [0, 20]: return the chosen token's logprob and
  // the N most likely alternatives. Logprobs come from the log-softmax of the
  // RAW logits (before penalties, temperature and filtering), which is
  // vLLM's default.
  std::optional<int32_t> logprobs;
  // In [0, 20]: return this many top candidates of the PROCESSED distribution
  // the draw used (after penalties, temperature and filtering), for
  // `--show_probs` style views. 0 = none.
  int32_t show_probs = 0;
};

// Checks the fields that do not depend on the prompt or the model:
// InvalidArgument naming the field and its allowed range. Never clamps.
absl::Status ValidateSamplingFields(const SamplingParams& params);

// ValidateSamplingFields plus the lengths: the prompt must not be empty and
// prompt_tokens + max_tokens must be <= context_length.
absl::Status Validate(const SamplingParams& params, int64_t prompt_tokens,
                      int64_t context_length);

// Whether generating `token` ends the request: it is one of
// params.stop_token_ids, or one of `eos_token_ids` and !params.ignore_eos.
bool IsStopToken(const SamplingParams& params, int32_t token,
                 std::span<const int32_t> eos_token_ids);

}  // namespace baton

#endif  // BATON_WORKER_SAMPLER_SAMPLING_PARAMS_H_
