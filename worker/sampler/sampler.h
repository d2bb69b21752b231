// Per-request token sampling with vLLM's semantics.
//
// One RequestSampler per request. Each step the engine passes the logits of
// the request's next token to Sample() and, once it has decided the token
// that is actually appended (normally result.token), calls Accept(token).
// Sample() is a pure function of (params, seed, prompt, accepted tokens,
// logits): calling it again before Accept() gives the same result, and the
// result never depends on other requests in the batch or their order.
//
// Randomness is counter-based: draw n (n = number of accepted tokens) is
// output n of a SplitMix64 stream seeded with seed(). A sampler rebuilt
// elsewhere (e.g. on a decode worker after prefill sampled the first token)
// from the same params with `seed = seed()`, the same prompt and the same
// accepted tokens continues the identical stream.
//
// Pipeline of Sample(), in vLLM's order:
//   1. repetition penalty over prompt + output tokens (logit > 0: divide,
//      else multiply), then frequency and presence penalties over output
//      tokens only;
//   2. temperature == 0: argmax of the penalized logits (ties: lowest id);
//   3. otherwise softmax(penalized / temperature), then top-k, top-p and
//      min-p filtering, and an inverse-CDF draw over the kept candidates in
//      a fixed order: probability descending, ties by token id ascending.
//      Top-k keeps exactly k tokens (ties at the k-th logit go to the lower
//      ids). Top-p keeps a candidate iff the mass of the candidates before
//      it is < top_p. Min-p compares against the most likely candidate.
//      The vocabulary is never fully sorted (see candidate_list.h).
//
// Threading: Sample() is const and may run concurrently with Sample() on any
// sampler; Accept() must not overlap Sample() on the same sampler. Sample()
// uses a per-thread scratch of ~18 bytes per vocabulary entry.
#ifndef BATON_WORKER_SAMPLER_SAMPLER_H_
#define BATON_WORKER_SAMPLER_SAMPLER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "worker/sampler/sampling_params.h"

namespace baton {

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

struct TokenProb {
  int32_t token = -1;
  float prob = 0.0f;
};

struct SampleResult {
  // The sampled token id.
  int32_t token = -1;
  // Set iff params.logprobs is set: log_softmax(raw logits)[token].
  std::optional<float> logprob;
  // params.logprobs entries (fewer if the vocabulary is smaller) of
  // log_softmax(raw logits), logprob descending, ties by token id ascending.
  std::vector<TokenLogprob> top_logprobs;
  // params.show_probs entries of the distribution the draw used, probability
  // descending (ties by id), at most the number of kept candidates. For
  // greedy requests: softmax of the penalized logits at temperature 1, the
  // distribution argmax ran over.
  std::vector<TokenProb> processed;
};

class RequestSampler {
 public:
  // InvalidArgument if ValidateSamplingFields(params) fails or a prompt token
  // id is negative. prompt: the request's prompt token ids (may be empty).
  static absl::StatusOr<std::unique_ptr<RequestSampler>> Create(
      const SamplingParams& params, std::span<const int32_t> prompt);

  RequestSampler(const RequestSampler&) = delete;
  RequestSampler& operator=(const RequestSampler&) = delete;

  // logits: [vocab] for this request's next token. -inf marks a token that
  // must not be drawn. InvalidArgument if logits is empty, holds NaN or
  // +inf, has no finite entry, or is shorter than the largest prompt or
  // accepted token id + 1. Does not change the sampler's state.
  absl::StatusOr<SampleResult> Sample(std::span<const float> logits) const;

  // Records `token` as generated: it counts for the penalties and advances
  // the random stream. REQUIRES: token >= 0.
  void Accept(int32_t token);

  // Applies step 1 of the pipeline in place. REQUIRES: logits.size() >
  // every prompt and accepted token id.
  void ApplyPenalties(std::span<float> logits) const;

  // The seed in use (params.seed, or the one drawn at creation).
  uint64_t seed() const { return seed_; }
  // Tokens accepted so far.
  int64_t num_generated() const { return num_generated_; }
  const SamplingParams& params() const { return params_; }

 private:
  struct TokenStats {
    bool in_prompt = false;
    int32_t generated = 0;
  };

  RequestSampler(const SamplingParams& params, uint64_t seed);

  // Uniform in [0, 1) for draw number num_generated_.
  double Uniform() const;

  SamplingParams params_;
  uint64_t seed_;
  int64_t num_generated_ = 0;
  // Largest prompt or accepted token id; -1 if none.
  int32_t max_token_id_ = -1;
  bool has_penalties_ = false;
  absl::flat_hash_map<int32_t, TokenStats> stats_;
};

}  // namespace baton

#endif  // BATON_WORKER_SAMPLER_SAMPLER_H_
