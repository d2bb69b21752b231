// OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}`
// with an HTTP status, made from Baton's canonical status codes.
//
//   INVALID_ARGUMENT, OUT_OF_RANGE, FAILED_PRECONDITION  400
//   NOT_FOUND                                            404
//   RESOURCE_EXHAUSTED                                   429
//   UNAVAILABLE, CANCELLED (by the server)               503
//   DEADLINE_EXCEEDED                                    504
//   anything else                                        500
#ifndef BATON_COORDINATOR_HTTP_OPENAI_ERROR_H_
#define BATON_COORDINATOR_HTTP_OPENAI_ERROR_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace baton::http {

struct HttpError {
  int status = 500;
  // The JSON error object, serialized.
  std::string body;
};

// The HTTP status for a canonical code (table above).
int HttpStatusFor(absl::StatusCode code);

// The field a message names, OpenAI's `param`: the leading field path of
// messages such as "top_p must be ..." or "sampling.top_p must be ..."
// (without "sampling."), or "model" for NOT_FOUND; empty when none.
std::string ParamOf(const absl::Status& status);

// A Generate call's INVALID_ARGUMENT (or OUT_OF_RANGE) about its prompt in
// the names of the OpenAI request it came from: the baton.v1 path that
// starts the message ("text", "token_ids.token_ids[3]", "chat.messages[0]
// .role", "prompt.chat.messages", ...) becomes `prompt_field` ("messages",
// "prompt" or "prompt[i]") followed by what the path named inside the
// prompt ("prompt[1][3]", "messages[0].role"); "sampling.stop: ..." loses
// its "sampling." (the OpenAI body's fields are top level). Any other
// status is returned as is.
absl::Status InRequestTerms(const absl::Status& status,
                            absl::string_view prompt_field);

// {"error": {...}} for `status`; `type` and `code` derive from its code.
nlohmann::json ErrorJson(const absl::Status& status);

// The HTTP response for a failed request.
HttpError ToHttpError(const absl::Status& status);
// An error the HTTP layer itself raises (404 route, 405, 413, ...).
HttpError MakeHttpError(int http_status, const std::string& message,
                        const std::string& code);

// gRPC status -> absl::Status (same code and message).
absl::Status FromGrpc(const grpc::Status& status);

}  // namespace baton::http

#endif  // BATON_COORDINATOR_HTTP_OPENAI_ERROR_H_
