// absl::Status as the grpc::Status a handler finishes with.
#ifndef BATON_COMMON_GRPC_GRPC_STATUS_H_
#define BATON_COMMON_GRPC_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace baton {

// absl and gRPC share the canonical code numbers; maps 1:1, message kept.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace baton

#endif  // BATON_COMMON_GRPC_GRPC_STATUS_H_
