// Limits on what one request may ask for, enforced at the coordinator's door
// (gRPC and, through it, HTTP) before any worker sees the request.
#ifndef BATON_COORDINATOR_SERVICE_REQUEST_LIMITS_H_
#define BATON_COORDINATOR_SERVICE_REQUEST_LIMITS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "baton/v1/api.pb.h"

namespace baton::coordinator {

struct RequestLimits {
  // Behaviour. Each is a baton-coordinator flag of the same name.
  // Bytes of a client's request_id, which must hold no control characters.
  // The id travels to the workers (with a suffix) and into every KV
  // transfer's header, which holds 256 bytes.
  int64_t max_request_id_bytes = 128;
  // Stop strings of one request: how many, the bytes of each, all together.
  // Every generated token is checked against each on the engine thread.
  int64_t max_stop_strings = 16;
  int64_t max_stop_string_bytes = 256;
  int64_t max_stop_bytes_total = 1024;
  // Stop token ids of one request.
  int64_t max_stop_token_ids = 64;
  // Prompt text (text prompts and chat messages' contents together), before
  // tokenization: the tokenizer's work is bounded by it.
  int64_t max_prompt_bytes = int64_t{1} << 20;
  // Messages of a chat prompt.
  int64_t max_chat_messages = 1024;
  // Tokens of the prompt after tokenization (pre-tokenized prompts too);
  // 0: the model's context length (prompt + max_tokens must fit it anyway).
  int64_t max_prompt_tokens = 0;
};

// InvalidArgument naming the first field of `request` over its limit, with
// the limit ("sampling.stop: 20 strings, the limit is 16
// (--max_stop_strings)"). Checks what needs no tokenizer.
absl::Status CheckRequestLimits(const RequestLimits& limits,
                                const v1::GenerateRequest& request);

// InvalidArgument if a prompt of `prompt_tokens` tokens is over
// limits.max_prompt_tokens (when set).
absl::Status CheckPromptTokens(const RequestLimits& limits,
                               int64_t prompt_tokens);

}  // namespace baton::coordinator

#endif  // BATON_COORDINATOR_SERVICE_REQUEST_LIMITS_H_
