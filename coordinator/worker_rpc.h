// The typed payloads that say why an attempt of a request failed, read by
// the request state machine's retry decision (never the message text):
// which worker RPC failed (kWorkerRpcPayload), or which worker went DOWN
// (kWorkerDownPayload).
#ifndef BATON_COORDINATOR_WORKER_RPC_H_
#define BATON_COORDINATOR_WORKER_RPC_H_

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

namespace baton::coordinator {

// Payload type URL on the UNAVAILABLE status of an attempt that failed
// because a worker holding one of its leases went DOWN. Its value is the id
// of the worker that went DOWN.
inline constexpr absl::string_view kWorkerDownPayload =
    "type.baton.dev/baton.WorkerDown";

// The worker RPC a status came from, carried as its kWorkerRpcPayload (one
// byte).
enum class WorkerRpc : char {
  kReserveKv = 'r',
  kPrefill = 'p',         // before the first token
  kPrefillHandoff = 'h',  // the rest of the Prefill stream (KV handoff)
  kDecode = 'd',
  // A ReserveKv made beside the Prefill (ClusterOptions::
  // overlap_reserve_kv), whose refusal starts the request over.
  kReserveKvBesidePrefill = 'b',
  // The reservation's target sent to the prefill worker after its Prefill
  // (SetKvTarget).
  kSetKvTarget = 't',
};
inline constexpr absl::string_view kWorkerRpcPayload =
    "type.baton.dev/baton.WorkerRpc";

inline absl::string_view WorkerRpcName(WorkerRpc rpc) {
  switch (rpc) {
    case WorkerRpc::kReserveKv:
      return "ReserveKv";
    case WorkerRpc::kPrefill:
      return "Prefill";
    case WorkerRpc::kPrefillHandoff:
      return "Prefill (KV handoff)";
    case WorkerRpc::kDecode:
      return "Decode";
    case WorkerRpc::kReserveKvBesidePrefill:
      return "ReserveKv (beside the Prefill)";
    case WorkerRpc::kSetKvTarget:
      return "SetKvTarget";
  }
  return "?";
}

// `status` with `rpc` as its kWorkerRpcPayload.
inline absl::Status TagWorkerRpc(absl::Status status, WorkerRpc rpc) {
  status.SetPayload(
      kWorkerRpcPayload,
      absl::Cord(absl::string_view(reinterpret_cast<const char*>(&rpc), 1)));
  return status;
}

// True when `status` came from worker RPC `rpc` (TagWorkerRpc).
inline bool FromWorkerRpc(const absl::Status& status, WorkerRpc rpc) {
  const auto payload = status.GetPayload(kWorkerRpcPayload);
  return payload.has_value() &&
         *payload == absl::string_view(reinterpret_cast<const char*>(&rpc), 1);
}

}  // namespace baton::coordinator

#endif  // BATON_COORDINATOR_WORKER_RPC_H_
