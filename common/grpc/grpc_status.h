// absl::Status as the grpc::Status a handler finishes with, and the retry
// delay a refusal carries to its client.
#ifndef BATON_COMMON_GRPC_GRPC_STATUS_H_
#define BATON_COMMON_GRPC_GRPC_STATUS_H_

#include <grpcpp/client_context.h>
#include <grpcpp/support/status.h>

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace baton {

// absl and gRPC share the canonical code numbers; maps 1:1, message kept.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Trailing metadata of a call refused for load (RESOURCE_EXHAUSTED): how
// many milliseconds the client should wait before it tries again, in
// decimal. The HTTP API answers it as Retry-After.
inline constexpr char kRetryAfterMsKey[] = "baton-retry-after-ms";
// The same delay on an absl::Status (decimal milliseconds).
inline constexpr absl::string_view kRetryAfterPayload =
    "type.baton.dev/baton.RetryAfterMs";

// The delay a finished call's trailing metadata asks for; nullopt when
// there is none or it is not a number of milliseconds >= 0.
std::optional<absl::Duration> RetryAfterFrom(const grpc::ClientContext& call);
// Puts `delay` on a non-OK `status` / reads it back (nullopt: none).
void SetRetryAfter(absl::Status& status, absl::Duration delay);
std::optional<absl::Duration> RetryAfterOf(const absl::Status& status);

}  // namespace baton

#endif  // BATON_COMMON_GRPC_GRPC_STATUS_H_
