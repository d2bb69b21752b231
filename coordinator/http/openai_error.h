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
