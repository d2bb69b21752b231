// Conversions between baton.v1 messages and the types both the coordinator
// and the workers use: sampling parameters and the KV layout. (The engine's
// own outputs convert in worker/service/proto_convert.h.)
#ifndef BATON_PROTO_CONVERT_H_
#define BATON_PROTO_CONVERT_H_

#include "absl/status/statusor.h"
#include "baton/v1/types.pb.h"
#include "baton/v1/worker.pb.h"
#include "worker/kv_cache/kv_layout.h"
#include "worker/sampler/sampling_params.h"

namespace baton {

// Proto sampling parameters with the defaults of their unset optional
// fields. Worker RPCs require the seed: InvalidArgument "sampling.seed" when
// unset, and ValidateSamplingFields' errors otherwise.
absl::StatusOr<SamplingParams> FromProto(const v1::SamplingParams& proto);

v1::KvLayout ToProto(const KvLayout& layout);
// A registering worker's layout; InvalidArgument unless its dtype is F16 or
// F32.
absl::StatusOr<KvLayout> FromProto(const v1::KvLayout& proto);
// Whether a peer's proto layout equals ours field for field.
bool LayoutEquals(const v1::KvLayout& proto, const KvLayout& layout);

}  // namespace baton

#endif  // BATON_PROTO_CONVERT_H_
