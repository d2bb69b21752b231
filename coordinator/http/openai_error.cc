#include "coordinator/http/openai_error.h"

#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace baton::http {
namespace {

using Json = nlohmann::json;

std::string TypeFor(int http_status) {
  switch (http_status) {
    case 400:
    case 404:
    case 405:
    case 413:
    case 431:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable_error";
    case 504:
      return "timeout_error";
    default:
      return "server_error";
  }
}

std::string Dump(const Json& json) {
  return json.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return 400;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

std::string ParamOf(const absl::Status& status) {
  if (status.code() == absl::StatusCode::kNotFound &&
      absl::StartsWith(status.message(), "model")) {
    return "model";
  }
  if (status.code() != absl::StatusCode::kInvalidArgument &&
      status.code() != absl::StatusCode::kOutOfRange) {
    return "";
  }
  absl::string_view m = status.message();
  absl::ConsumePrefix(&m, "sampling.");
  size_t end = 0;
  while (end < m.size() &&
         (std::islower(static_cast<unsigned char>(m[end])) ||
          std::isdigit(static_cast<unsigned char>(m[end])) || m[end] == '_' ||
          m[end] == '.' || m[end] == '[' || m[end] == ']')) {
    ++end;
  }
  // A field path ends the word it starts ("top_p must", "prompt:").
  if (end == 0 || (end < m.size() && m[end] != ' ' && m[end] != ':')) {
    return "";
  }
  std::string param(m.substr(0, end));
  if (param == "body") return "";
  if (param == "prompt_tokens" && absl::StrContains(m, "max_tokens")) {
    return "max_tokens";
  }
  return param;
}

absl::Status InRequestTerms(const absl::Status& status,
                            absl::string_view prompt_field) {
  if (status.code() != absl::StatusCode::kInvalidArgument &&
      status.code() != absl::StatusCode::kOutOfRange) {
    return status;
  }
  // Longest first; each is a whole path segment of the message's start.
  static constexpr absl::string_view kPaths[] = {"prompt.token_ids.token_ids",
                                                 "prompt.chat.messages",
                                                 "prompt.text",
                                                 "prompt.chat",
                                                 "token_ids.token_ids",
                                                 "chat.messages",
                                                 "text",
                                                 "chat",
                                                 "prompt"};
  absl::string_view m = status.message();
  // The request's sampling fields are top-level fields of an OpenAI body.
  if (absl::ConsumePrefix(&m, "sampling.")) {
    return absl::Status(status.code(), m);
  }
  for (absl::string_view path : kPaths) {
    if (!absl::StartsWith(m, path)) continue;
    const absl::string_view rest = m.substr(path.size());
    if (!rest.empty() &&
        (std::isalnum(static_cast<unsigned char>(rest[0])) || rest[0] == '_')) {
      continue;  // "prompt_tokens ...", "textual": another word
    }
    // A chat's messages are the request's "messages" themselves.
    const bool messages = absl::EndsWith(path, "messages");
    return absl::Status(
        status.code(),
        absl::StrCat(messages ? absl::string_view("messages") : prompt_field,
                     rest));
  }
  return status;
}

Json ErrorJson(const absl::Status& status) {
  const int http_status = HttpStatusFor(status.code());
  const std::string param = ParamOf(status);
  std::string code =
      absl::AsciiStrToLower(absl::StatusCodeToString(status.code()));
  if (status.code() == absl::StatusCode::kNotFound && param == "model") {
    code = "model_not_found";
  }
  Json error = {{"message", std::string(status.message())},
                {"type", TypeFor(http_status)},
                {"param", param.empty() ? Json(nullptr) : Json(param)},
                {"code", code}};
  return Json{{"error", std::move(error)}};
}

HttpError ToHttpError(const absl::Status& status) {
  return HttpError{HttpStatusFor(status.code()), Dump(ErrorJson(status))};
}

HttpError MakeHttpError(int http_status, const std::string& message,
                        const std::string& code) {
  Json error = {{"message", message},
                {"type", TypeFor(http_status)},
                {"param", nullptr},
                {"code", code}};
  return HttpError{http_status, Dump(Json{{"error", std::move(error)}})};
}

absl::Status FromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

}  // namespace baton::http
