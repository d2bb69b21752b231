// Plain value types shared by the coordinator's registry, routing policies
// and request state machine. They mirror baton.v1 (proto/baton/v1/types.proto)
// and are converted to and from the protos only in service code, so the core
// logic builds and tests without gRPC.
#ifndef BATON_COORDINATOR_TYPES_H_
#define BATON_COORDINATOR_TYPES_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/strings/string_view.h"

namespace baton::coordinator {

// Assigned by the registry at first registration; stable per worker address.
using WorkerId = std::string;

// Mirrors baton.v1.WorkerRole.
enum class WorkerRole { kPrefill, kDecode, kBoth };

// Mirrors baton.v1.WorkerHealth.
enum class WorkerHealth { kHealthy, kSuspect, kDown, kDraining };

absl::string_view WorkerRoleName(WorkerRole role);        // "prefill", ...
absl::string_view WorkerHealthName(WorkerHealth health);  // "healthy", ...

// True for roles that can run a request's prefill (prefill, both).
inline bool CanPrefill(WorkerRole role) { return role != WorkerRole::kDecode; }
// True for roles that can run a request's decode (decode, both).
inline bool CanDecode(WorkerRole role) { return role != WorkerRole::kPrefill; }

// Mirrors baton.v1.WorkerLoad (the fields the coordinator uses).
struct WorkerLoad {
  // Prompt tokens admitted to the worker and not yet prefilled.
  int64_t queued_prefill_tokens = 0;
  // Sequences in the running decode batch.
  int32_t running_sequences = 0;
  // Blocks neither used nor reserved.
  int64_t kv_blocks_free = 0;
  int64_t kv_blocks_total = 0;
  // Blocks reserved for transfers that have not landed yet.
  int64_t kv_blocks_reserved = 0;
  // ReserveKv calls waiting at the worker for room.
  int32_t queued_reservations = 0;
  // Engine steps that ran a batch since the worker started.
  int64_t engine_steps = 0;
  // Prompt tokens prefilled per second of engine step time, recently; 0:
  // not measured yet.
  double prefill_tokens_per_second = 0;
  // Of queued_prefill_tokens, those beyond the prompt tokens this
  // coordinator itself had sent there and not seen prefilled when the
  // heartbeat arrived: other replicas' prompts (Cluster::Heartbeat sets it;
  // not on the wire).
  int64_t unowned_prefill_tokens = 0;
  // Likewise, of running_sequences, those beyond the requests this
  // coordinator had decoding there (RequestLoad::sequences).
  int32_t unowned_sequences = 0;

  bool operator==(const WorkerLoad&) const = default;
};

// One incarnation of a worker: a re-registration keeps the id and gets a new,
// higher epoch. Epochs are unique across the registry.
struct WorkerRef {
  WorkerId id;
  uint64_t epoch = 0;

  bool operator==(const WorkerRef&) const = default;
  auto operator<=>(const WorkerRef&) const = default;
};

// "w3@7".
std::string WorkerRefString(const WorkerRef& ref);
std::ostream& operator<<(std::ostream& os, const WorkerRef& ref);

}  // namespace baton::coordinator

#endif  // BATON_COORDINATOR_TYPES_H_
