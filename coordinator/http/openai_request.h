// OpenAI request bodies (POST /v1/chat/completions, POST /v1/completions)
// translated into baton.v1.GenerateRequest messages.
//
// Only types and the ranges that the HTTP layer itself owns (n, logprobs
// counts, integer widths) are checked here; sampling ranges and the context
// limit are checked by the Baton service, whose INVALID_ARGUMENT comes back
// as a 400 with its message unchanged. Every error here is InvalidArgument
// whose message starts with the offending field's name ("n must be ...").
#ifndef BATON_COORDINATOR_HTTP_OPENAI_REQUEST_H_
#define BATON_COORDINATOR_HTTP_OPENAI_REQUEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "baton/v1/api.pb.h"

namespace baton::http {

enum class Endpoint {
  kChat,        // /v1/chat/completions
  kCompletion,  // /v1/completions
};

// Largest `n` accepted; each choice is one Generate call.
inline constexpr int kMaxChoices = 16;
// Largest number of prompts in one /v1/completions request.
inline constexpr int kMaxPrompts = 64;

struct OpenAiRequest {
  Endpoint endpoint = Endpoint::kChat;
  // As sent; also echoed in every response object.
  std::string model;
  bool stream = false;
  // stream_options.include_usage: a last chunk with usage and no choices.
  bool include_usage = false;
  // Choices per prompt, in [1, kMaxChoices].
  int n = 1;
  // One request per prompt (chat: exactly one), with model, prompt and
  // sampling set; request_id empty. Choice c of prompt p has index p*n + c.
  std::vector<v1::GenerateRequest> prompts;
  // Return logprobs (chat: "logprobs": true; completions: "logprobs": N),
  // with this many alternatives per token.
  bool logprobs = false;
  int top_logprobs = 0;
  // No max_tokens / max_completion_tokens on a chat request: generate until
  // the context is full (OpenAI's chat default). The gateway sets
  // max_tokens = context_length - prompt_tokens before calling Generate.
  bool fill_context = false;
};

// Parses and checks `body`. InvalidArgument naming the field for invalid
// JSON, a non-object body, a wrong type, a missing required field, an
// out-of-range count, or a feature Baton does not serve (tools, logit_bias,
// echo, best_of > 1, suffix, non-text response_format or content parts).
// Unknown fields are ignored.
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(Endpoint endpoint,
                                                 absl::string_view body);

// The Generate request of choice `choice` (in [0, n)) of prompt `prompt`:
// prompts[prompt] with request_id set and, when a seed was given, the seed
// advanced by the choice's index (seed, seed+1, ... so n > 1 gives n
// different, reproducible samples).
v1::GenerateRequest ChoiceRequest(const OpenAiRequest& request, int prompt,
                                  int choice, const std::string& request_id);

}  // namespace baton::http

#endif  // BATON_COORDINATOR_HTTP_OPENAI_REQUEST_H_
