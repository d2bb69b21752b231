// Conversions between baton.v1 worker messages and the engine's types.
#ifndef BATON_WORKER_SERVICE_PROTO_CONVERT_H_
#define BATON_WORKER_SERVICE_PROTO_CONVERT_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "baton/v1/types.pb.h"
#include "baton/v1/worker.pb.h"
#include "worker/engine/request.h"
#include "worker/kv_cache/kv_layout.h"
#include "worker/sampler/sampling_params.h"

namespace baton {

// absl and gRPC share the canonical code numbers; maps 1:1, message kept.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Proto sampling parameters with the defaults of their unset optional
// fields. Worker RPCs require the seed: InvalidArgument "sampling.seed" when
// unset, and ValidateSamplingFields' errors otherwise.
absl::StatusOr<SamplingParams> FromProto(const v1::SamplingParams& proto);

// The engine's reporting of one token (logprobs and processed candidates).
v1::TokenLogprobs ToProto(const TokenOutput& token);

v1::KvLayout ToProto(const KvLayout& layout);
// Whether a peer's proto layout equals ours field for field.
bool LayoutEquals(const v1::KvLayout& proto, const KvLayout& layout);

v1::FinishReason ToProto(FinishReason reason);

}  // namespace baton

#endif  // BATON_WORKER_SERVICE_PROTO_CONVERT_H_
