// OpenAI response objects built from Baton's Generate stream: the
// non-streaming `chat.completion` / `text_completion` objects, the streamed
// chunks (`chat.completion.chunk`, `text_completion`) and their
// Server-Sent-Events framing.
#ifndef BATON_COORDINATOR_HTTP_OPENAI_RESPONSE_H_
#define BATON_COORDINATOR_HTTP_OPENAI_RESPONSE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "baton/v1/api.pb.h"
#include "coordinator/http/openai_request.h"
#include "nlohmann/json.hpp"

namespace baton::http {

// The bytes of a vocabulary entry (need not be valid UTF-8).
using TokenBytesFn = std::function<std::string(int32_t)>;

// "stop", "length", "abort" (cancelled by the server); "error" otherwise.
std::string FinishReasonName(v1::FinishReason reason);

// Serializes with invalid UTF-8 replaced by U+FFFD (token pieces may split
// characters).
std::string DumpJson(const nlohmann::json& json);

// One SSE event: "data: <json>\n\n".
std::string SseEvent(const nlohmann::json& json);
inline constexpr char kSseDone[] = "data: [DONE]\n\n";

// One finished choice of a non-streaming response.
struct ChoiceResult {
  int index = 0;
  std::string text;
  // From NewLogprobs / AppendLogprobs; null without logprobs.
  nlohmann::json logprobs;
  std::string finish_reason;
};

class ResponseFormatter {
 public:
  // `id` is the response id ("chatcmpl-..." / "cmpl-..."), `created` unix
  // seconds. `token_bytes` must outlive the formatter.
  ResponseFormatter(const OpenAiRequest& request, std::string id,
                    int64_t created, TokenBytesFn token_bytes);

  // An empty logprobs object of the endpoint's shape: chat {"content": []},
  // completions {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
  // (empty arrays).
  nlohmann::json NewLogprobs() const;
  // Appends one entry per token to `logprobs` (from NewLogprobs).
  // `text_offset` is the completion-text byte offset of the first token
  // (completions only); it advances by each token's byte length.
  void AppendLogprobs(
      const google::protobuf::RepeatedPtrField<v1::TokenLogprobs>& tokens,
      nlohmann::json& logprobs, int64_t& text_offset) const;

  // Streamed chunks, one choice each. `logprobs` may be null.
  // Chat only: the first chunk of a choice, delta {"role": "assistant"}.
  nlohmann::json RoleChunk(int index) const;
  nlohmann::json TextChunk(int index, const std::string& text,
                           nlohmann::json logprobs) const;
  nlohmann::json FinishChunk(int index, const std::string& finish_reason) const;
  // stream_options.include_usage: the last chunk, no choices.
  nlohmann::json UsageChunk(const v1::Usage& usage) const;

  // The whole non-streaming response.
  nlohmann::json Completion(const std::vector<ChoiceResult>& choices,
                            const v1::Usage& usage) const;

  static nlohmann::json UsageJson(const v1::Usage& usage);

 private:
  nlohmann::json Envelope(const char* object) const;
  nlohmann::json Chunk(nlohmann::json choice) const;
  nlohmann::json TokenEntry(int32_t id, double logprob) const;

  const Endpoint endpoint_;
  const std::string model_;
  const bool logprobs_;
  const bool include_usage_;
  const std::string id_;
  const int64_t created_;
  TokenBytesFn token_bytes_;
};

}  // namespace baton::http

#endif  // BATON_COORDINATOR_HTTP_OPENAI_RESPONSE_H_
