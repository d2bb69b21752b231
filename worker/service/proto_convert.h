// Conversions between baton.v1 worker messages and the engine's types; the
// ones the coordinator shares live in proto/convert.h (included here), and
// ToGrpcStatus in common/grpc/grpc_status.h.
#ifndef BATON_WORKER_SERVICE_PROTO_CONVERT_H_
#define BATON_WORKER_SERVICE_PROTO_CONVERT_H_

#include "baton/v1/types.pb.h"
#include "baton/v1/worker.pb.h"
#include "common/grpc/grpc_status.h"
#include "proto/convert.h"
#include "worker/engine/request.h"

namespace baton {

// The engine's reporting of one token (logprobs and processed candidates).
v1::TokenLogprobs ToProto(const TokenOutput& token);

v1::FinishReason ToProto(FinishReason reason);

}  // namespace baton

#endif  // BATON_WORKER_SERVICE_PROTO_CONVERT_H_
