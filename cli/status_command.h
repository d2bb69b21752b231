// `baton status --server=HOST:PORT`: the cluster's workers as the
// coordinator sees them (baton.v1.Baton/GetClusterStatus).
#ifndef BATON_CLI_STATUS_COMMAND_H_
#define BATON_CLI_STATUS_COMMAND_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "baton/v1/api.pb.h"
#include "common/auth/bearer_interceptor.h"
#include "nlohmann/json.hpp"

namespace baton::cli {

struct StatusOptions {
  // host:port of the coordinator's Baton service. Required.
  std::string server;
  // TLS and API key (plaintext, no key by default).
  ClientSecurity security;
  // Also list workers whose lease expired.
  bool include_down = false;
  // JSON instead of a table.
  bool json = false;
  // Client deadline of the RPC in milliseconds; 0: none.
  int64_t deadline_ms = 0;
};

// Prints the table (or the JSON object) to `out`. An RPC failure is
// returned as is (code and message).
absl::Status RunStatus(const StatusOptions& options, std::ostream& out);

// {"workers": [{"id", "address", "role", "healthy", "health", "model_id",
// "kv_blocks_free", "kv_blocks_total", "kv_blocks_reserved",
// "running_sequences", "queued_prefill_tokens", "waiting_requests",
// "active_transfers", "queued_reservations", "active_requests", "epoch",
// "last_heartbeat_age_ms"},
// ...], "active_requests": N}. role is "prefill", "decode", "both" or
// "unspecified"; health is "healthy", "suspect", "down", "draining" or
// "unspecified"; healthy is health == "healthy".
nlohmann::json ClusterStatusJson(const v1::GetClusterStatusResponse& status);

// One row per worker under a header, then the coordinator's active requests.
std::string ClusterStatusTable(const v1::GetClusterStatusResponse& status);

}  // namespace baton::cli

#endif  // BATON_CLI_STATUS_COMMAND_H_
