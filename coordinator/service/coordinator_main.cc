// `baton-coordinator`: the cluster's front door and control plane.
//   baton-coordinator --listen=127.0.0.1:PORT --model=PATH
//                     [--policy=least_loaded|round_robin]
//                     [--heartbeat_ms=N] [--lease_ttl_ms=N]
//                     [--queue_timeout_ms=N] [--transfer_timeout_ms=N]
// Serves baton.v1.Baton (clients) and baton.v1.Coordinator (workers) on one
// port, plus the health service and reflection. --model names the model
// the workers serve; the coordinator reads only its tokenizer and limits.
// Stops on SIGINT / SIGTERM.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/grpc/serving.h"
#include "coordinator/service/cluster.h"
#include "coordinator/service/coordinator_services.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "host:port of the Baton and Coordinator services (port 0: any free "
          "port)");
ABSL_FLAG(std::string, model, "",
          "GGUF file or HF folder of the served model (tokenizer and limits)");
ABSL_FLAG(std::string, policy, "least_loaded", "least_loaded or round_robin");
ABSL_FLAG(int64_t, heartbeat_ms, 500, "workers heartbeat this often");
ABSL_FLAG(int64_t, lease_ttl_ms, 3000,
          "a worker without a heartbeat for this long is down");
ABSL_FLAG(int64_t, queue_timeout_ms, 30000,
          "how long a request waits for a decode worker with free KV blocks");
ABSL_FLAG(int64_t, transfer_timeout_ms, 30000,
          "a KV transfer that takes longer fails the request");

namespace baton::coordinator {
namespace {

void Log(const std::string& line) {
  std::fprintf(stderr, "baton-coordinator: %s\n", line.c_str());
}

int Main() {
  BlockTerminationSignals();

  const std::string model_path = absl::GetFlag(FLAGS_model);
  if (model_path.empty()) {
    Log("--model is required");
    return 2;
  }
  const int64_t heartbeat_ms = absl::GetFlag(FLAGS_heartbeat_ms);
  const int64_t lease_ms = absl::GetFlag(FLAGS_lease_ttl_ms);
  if (heartbeat_ms < 1 || lease_ms <= heartbeat_ms) {
    Log("--heartbeat_ms must be >= 1 and --lease_ttl_ms > --heartbeat_ms");
    return 2;
  }
  auto model = ServedModel::Load(model_path);
  if (!model.ok()) {
    Log(model.status().ToString());
    return 1;
  }
  const std::string model_id = (*model)->id();
  ClusterOptions options;
  options.policy = absl::GetFlag(FLAGS_policy);
  options.registry.heartbeat_interval = absl::Milliseconds(heartbeat_ms);
  options.registry.lease_ttl = absl::Milliseconds(lease_ms);
  options.registry.suspect_after = absl::Milliseconds(
      std::max(heartbeat_ms * 2, (heartbeat_ms + lease_ms) / 2));
  if (options.registry.suspect_after >= options.registry.lease_ttl) {
    options.registry.suspect_after = options.registry.heartbeat_interval;
  }
  options.queue_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_queue_timeout_ms));
  options.transfer_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_transfer_timeout_ms));
  auto cluster = Cluster::Create(options, std::move(*model), RealClock());
  if (!cluster.ok()) {
    Log(cluster.status().ToString());
    return 2;
  }
  ControlPlaneService control_plane(cluster->get());
  BatonService api(cluster->get());

  auto running =
      StartServer(absl::GetFlag(FLAGS_listen), {&control_plane, &api});
  if (!running.ok()) {
    Log(running.status().ToString());
    return 1;
  }
  std::unique_ptr<grpc::Server> server = std::move(running->server);
  std::printf("baton-coordinator listening on %s, model %s\n",
              running->address.c_str(), model_id.c_str());
  std::fflush(stdout);

  Log(absl::StrCat("signal ", WaitForTerminationSignal(), ", stopping"));
  // Calls end first (their clients get UNAVAILABLE), then the server (no
  // handler runs after it), then the cluster.
  (*cluster)->Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server.reset();
  cluster->reset();
  return 0;
}

}  // namespace
}  // namespace baton::coordinator

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "baton-coordinator --listen=HOST:PORT --model=PATH "
      "[--policy=least_loaded|round_robin] [--heartbeat_ms=N] "
      "[--lease_ttl_ms=N] [--queue_timeout_ms=N] [--transfer_timeout_ms=N]");
  absl::ParseCommandLine(argc, argv);
  return baton::coordinator::Main();
}
