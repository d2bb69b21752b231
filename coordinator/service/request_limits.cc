#include "coordinator/service/request_limits.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace baton::coordinator {
namespace {

absl::Status Over(const std::string& what, int64_t got, const char* unit,
                  int64_t limit, const char* flag) {
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": ", got, " ", unit, ", the limit is ", limit, " (--", flag, ")"));
}

}  // namespace

absl::Status CheckRequestLimits(const RequestLimits& limits,
                                const v1::GenerateRequest& request) {
  const std::string& id = request.request_id();
  if (static_cast<int64_t>(id.size()) > limits.max_request_id_bytes) {
    return Over("request_id", static_cast<int64_t>(id.size()), "bytes",
                limits.max_request_id_bytes, "max_request_id_bytes");
  }
  for (size_t i = 0; i < id.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(id[i]);
    if (c < 0x20 || c == 0x7F) {
      return absl::InvalidArgumentError(
          absl::StrCat("request_id: control character 0x", absl::Hex(c),
                       " at byte ", i, " (printable characters only)"));
    }
  }
  const v1::SamplingParams& sampling = request.sampling();
  if (sampling.stop_size() > limits.max_stop_strings) {
    return Over("sampling.stop", sampling.stop_size(), "strings",
                limits.max_stop_strings, "max_stop_strings");
  }
  int64_t stop_total = 0;
  for (int i = 0; i < sampling.stop_size(); ++i) {
    const int64_t bytes = static_cast<int64_t>(sampling.stop(i).size());
    if (bytes > limits.max_stop_string_bytes) {
      return Over(absl::StrCat("sampling.stop[", i, "]"), bytes, "bytes",
                  limits.max_stop_string_bytes, "max_stop_string_bytes");
    }
    stop_total += bytes;
  }
  if (stop_total > limits.max_stop_bytes_total) {
    return Over("sampling.stop", stop_total, "bytes in all",
                limits.max_stop_bytes_total, "max_stop_bytes_total");
  }
  if (sampling.stop_token_ids_size() > limits.max_stop_token_ids) {
    return Over("sampling.stop_token_ids", sampling.stop_token_ids_size(),
                "ids", limits.max_stop_token_ids, "max_stop_token_ids");
  }
  int64_t prompt_bytes = 0;
  const char* prompt_field = "prompt.text";
  switch (request.prompt_case()) {
    case v1::GenerateRequest::kText:
      prompt_bytes = static_cast<int64_t>(request.text().size());
      break;
    case v1::GenerateRequest::kChat: {
      prompt_field = "prompt.chat";
      const int64_t messages = request.chat().messages_size();
      if (messages > limits.max_chat_messages) {
        return Over("prompt.chat.messages", messages, "messages",
                    limits.max_chat_messages, "max_chat_messages");
      }
      for (const v1::ChatMessage& m : request.chat().messages()) {
        prompt_bytes +=
            static_cast<int64_t>(m.role().size() + m.content().size());
      }
      break;
    }
    case v1::GenerateRequest::kTokenIds:
      return CheckPromptTokens(limits, request.token_ids().token_ids_size());
    default:
      break;
  }
  if (prompt_bytes > limits.max_prompt_bytes) {
    return Over(prompt_field, prompt_bytes, "bytes", limits.max_prompt_bytes,
                "max_prompt_bytes");
  }
  return absl::OkStatus();
}

absl::Status CheckPromptTokens(const RequestLimits& limits,
                               int64_t prompt_tokens) {
  if (limits.max_prompt_tokens > 0 &&
      prompt_tokens > limits.max_prompt_tokens) {
    return Over("prompt", prompt_tokens, "tokens", limits.max_prompt_tokens,
                "max_prompt_tokens");
  }
  return absl::OkStatus();
}

}  // namespace baton::coordinator
