#include "coordinator/http/openai_response.h"

#include <utility>

namespace baton::http {

using Json = nlohmann::json;

std::string FinishReasonName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_CANCELLED:
      return "abort";
    default:
      return "error";
  }
}

std::string DumpJson(const Json& json) {
  return json.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string SseEvent(const Json& json) {
  std::string out = "data: ";
  out += DumpJson(json);
  out += "\n\n";
  return out;
}

ResponseFormatter::ResponseFormatter(const OpenAiRequest& request,
                                     std::string id, int64_t created,
                                     TokenBytesFn token_bytes)
    : endpoint_(request.endpoint),
      model_(request.model),
      logprobs_(request.logprobs),
      include_usage_(request.include_usage),
      id_(std::move(id)),
      created_(created),
      token_bytes_(std::move(token_bytes)) {}

Json ResponseFormatter::NewLogprobs() const {
  if (endpoint_ == Endpoint::kChat) {
    return Json{{"content", Json::array()}, {"refusal", nullptr}};
  }
  return Json{{"tokens", Json::array()},
              {"token_logprobs", Json::array()},
              {"top_logprobs", Json::array()},
              {"text_offset", Json::array()}};
}

Json ResponseFormatter::TokenEntry(int32_t id, double logprob) const {
  const std::string bytes = token_bytes_(id);
  Json byte_list = Json::array();
  for (unsigned char c : bytes) byte_list.push_back(static_cast<int>(c));
  return Json{{"token", bytes}, {"logprob", logprob}, {"bytes", byte_list}};
}

void ResponseFormatter::AppendLogprobs(
    const google::protobuf::RepeatedPtrField<v1::TokenLogprobs>& tokens,
    Json& logprobs, int64_t& text_offset) const {
  for (const v1::TokenLogprobs& t : tokens) {
    if (endpoint_ == Endpoint::kChat) {
      Json entry = TokenEntry(t.token_id(), t.logprob());
      Json top = Json::array();
      for (const v1::TokenLogprob& alt : t.top_logprobs()) {
        top.push_back(TokenEntry(alt.token_id(), alt.logprob()));
      }
      entry["top_logprobs"] = std::move(top);
      logprobs["content"].push_back(std::move(entry));
    } else {
      const std::string piece = token_bytes_(t.token_id());
      logprobs["tokens"].push_back(piece);
      logprobs["token_logprobs"].push_back(t.logprob());
      Json top = Json::object();
      for (const v1::TokenLogprob& alt : t.top_logprobs()) {
        // Two ids with the same text keep the likelier (listed first).
        const std::string alt_piece = token_bytes_(alt.token_id());
        if (!top.contains(alt_piece)) top[alt_piece] = alt.logprob();
      }
      logprobs["top_logprobs"].push_back(std::move(top));
      logprobs["text_offset"].push_back(text_offset);
      text_offset += static_cast<int64_t>(piece.size());
    }
  }
}

Json ResponseFormatter::Envelope(const char* object) const {
  return Json{{"id", id_},
              {"object", object},
              {"created", created_},
              {"model", model_}};
}

Json ResponseFormatter::Chunk(Json choice) const {
  Json chunk = Envelope(endpoint_ == Endpoint::kChat ? "chat.completion.chunk"
                                                     : "text_completion");
  chunk["choices"] = Json::array({std::move(choice)});
  if (include_usage_) chunk["usage"] = nullptr;
  return chunk;
}

Json ResponseFormatter::RoleChunk(int index) const {
  return Chunk(Json{{"index", index},
                    {"delta", {{"role", "assistant"}, {"content", ""}}},
                    {"logprobs", nullptr},
                    {"finish_reason", nullptr}});
}

Json ResponseFormatter::TextChunk(int index, const std::string& text,
                                  Json logprobs) const {
  if (endpoint_ == Endpoint::kChat) {
    return Chunk(Json{{"index", index},
                      {"delta", {{"content", text}}},
                      {"logprobs", std::move(logprobs)},
                      {"finish_reason", nullptr}});
  }
  return Chunk(Json{{"index", index},
                    {"text", text},
                    {"logprobs", std::move(logprobs)},
                    {"finish_reason", nullptr}});
}

Json ResponseFormatter::FinishChunk(int index,
                                    const std::string& finish_reason) const {
  Json choice = {{"index", index},
                 {"logprobs", nullptr},
                 {"finish_reason", finish_reason}};
  if (endpoint_ == Endpoint::kChat) {
    choice["delta"] = Json::object();
  } else {
    choice["text"] = "";
  }
  return Chunk(std::move(choice));
}

Json ResponseFormatter::UsageJson(const v1::Usage& usage) {
  return Json{
      {"prompt_tokens", usage.prompt_tokens()},
      {"completion_tokens", usage.completion_tokens()},
      {"total_tokens",
       static_cast<int64_t>(usage.prompt_tokens()) + usage.completion_tokens()},
      {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens()}}}};
}

Json ResponseFormatter::UsageChunk(const v1::Usage& usage) const {
  Json chunk = Envelope(endpoint_ == Endpoint::kChat ? "chat.completion.chunk"
                                                     : "text_completion");
  chunk["choices"] = Json::array();
  chunk["usage"] = UsageJson(usage);
  return chunk;
}

Json ResponseFormatter::Completion(const std::vector<ChoiceResult>& choices,
                                   const v1::Usage& usage) const {
  const bool chat = endpoint_ == Endpoint::kChat;
  Json out = Envelope(chat ? "chat.completion" : "text_completion");
  Json list = Json::array();
  for (const ChoiceResult& c : choices) {
    Json choice = {{"index", c.index},
                   {"logprobs", logprobs_ ? c.logprobs : Json(nullptr)},
                   {"finish_reason", c.finish_reason}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      choice["text"] = c.text;
    }
    list.push_back(std::move(choice));
  }
  out["choices"] = std::move(list);
  out["usage"] = UsageJson(usage);
  return out;
}

}  // namespace baton::http
