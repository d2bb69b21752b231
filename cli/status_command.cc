#include "cli/status_command.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "baton/v1/api.grpc.pb.h"
#include "common/status_macros.h"

namespace baton::cli {
namespace {

using Json = nlohmann::json;

// "WORKER_ROLE_PREFILL" with prefix "WORKER_ROLE_" -> "prefill".
std::string EnumName(std::string name, absl::string_view prefix) {
  if (absl::StartsWith(name, prefix)) name.erase(0, prefix.size());
  if (name.empty()) return "unknown";
  return absl::AsciiStrToLower(name);
}

std::string RoleName(v1::WorkerRole role) {
  return EnumName(v1::WorkerRole_Name(role), "WORKER_ROLE_");
}

std::string HealthName(v1::WorkerHealth health) {
  return EnumName(v1::WorkerHealth_Name(health), "WORKER_HEALTH_");
}

// "1.2 s", "350 ms".
std::string AgeText(double ms) {
  if (ms >= 1000.0) return absl::StrFormat("%.1f s", ms / 1000.0);
  return absl::StrFormat("%.0f ms", ms);
}

}  // namespace

Json ClusterStatusJson(const v1::GetClusterStatusResponse& status) {
  Json workers = Json::array();
  for (const v1::WorkerStatus& w : status.workers()) {
    const v1::WorkerLoad& load = w.load();
    workers.push_back({
        {"id", w.worker().worker_id()},
        {"address", w.worker().address()},
        {"role", RoleName(w.role())},
        {"healthy", w.health() == v1::WORKER_HEALTH_HEALTHY},
        {"health", HealthName(w.health())},
        {"model_id", w.model_id()},
        {"kv_blocks_free", load.kv_blocks_free()},
        {"kv_blocks_total", load.kv_blocks_total()},
        {"kv_blocks_reserved", load.kv_blocks_reserved()},
        {"running_sequences", load.running_sequences()},
        {"queued_prefill_tokens", load.queued_prefill_tokens()},
        {"prefill_tokens_per_second", load.prefill_tokens_per_second()},
        {"waiting_requests", load.waiting_requests()},
        {"active_transfers", load.active_transfers()},
        {"queued_reservations", load.queued_reservations()},
        {"active_requests", w.active_requests()},
        {"epoch", w.epoch()},
        {"last_heartbeat_age_ms", w.last_heartbeat_age_ms()},
    });
  }
  return {{"workers", workers}, {"active_requests", status.active_requests()}};
}

std::string ClusterStatusTable(const v1::GetClusterStatusResponse& status) {
  const std::vector<std::string> header = {
      "ID",      "ADDRESS", "ROLE",          "HEALTH",   "EPOCH",
      "RUNNING", "QUEUED",  "KV FREE/TOTAL", "HEARTBEAT"};
  std::vector<std::vector<std::string>> rows = {header};
  for (const v1::WorkerStatus& w : status.workers()) {
    const v1::WorkerLoad& load = w.load();
    rows.push_back(
        {w.worker().worker_id(), w.worker().address(), RoleName(w.role()),
         HealthName(w.health()), absl::StrCat(w.epoch()),
         absl::StrCat(load.running_sequences()),
         absl::StrCat(load.queued_prefill_tokens()),
         absl::StrCat(load.kv_blocks_free(), "/", load.kv_blocks_total()),
         absl::StrCat(AgeText(w.last_heartbeat_age_ms()), " ago")});
  }
  std::vector<size_t> width(header.size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) {
      width[c] = std::max(width[c], row[c].size());
    }
  }
  std::string text;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const bool last = c + 1 == row.size();
      absl::StrAppend(
          &line, row[c],
          last ? "" : std::string(width[c] - row[c].size() + 2, ' '));
    }
    absl::StrAppend(&text, line, "\n");
  }
  if (status.workers().empty()) absl::StrAppend(&text, "(no workers)\n");
  absl::StrAppend(&text, status.workers_size(), " workers, ",
                  status.active_requests(), " active requests\n");
  return text;
}

absl::Status RunStatus(const StatusOptions& options, std::ostream& out) {
  if (options.server.empty()) {
    return absl::InvalidArgumentError("--server: HOST:PORT is required");
  }
  if (options.deadline_ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--deadline_ms must be >= 0 (0 = none), got ", options.deadline_ms));
  }
  BATON_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                         OpenChannel(options.server, options.security));
  auto stub = v1::Baton::NewStub(channel);
  grpc::ClientContext context;
  if (options.deadline_ms > 0) {
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(options.deadline_ms));
  }
  v1::GetClusterStatusRequest request;
  request.set_include_down(options.include_down);
  v1::GetClusterStatusResponse response;
  const grpc::Status status =
      stub->GetClusterStatus(&context, request, &response);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        status.error_message());
  }
  if (options.json) {
    out << ClusterStatusJson(response).dump(-1, ' ', false,
                                            Json::error_handler_t::replace)
        << "\n";
  } else {
    out << ClusterStatusTable(response);
  }
  return absl::OkStatus();
}

}  // namespace baton::cli
