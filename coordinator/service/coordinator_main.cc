// `baton-coordinator`: the cluster's front door and control plane.
//   baton-coordinator --listen=127.0.0.1:PORT --model=PATH
//                     [--policy=least_loaded|round_robin]
//                     [--heartbeat_ms=N] [--lease_ttl_ms=N]
//                     [--queue_timeout_ms=N] [--transfer_timeout_ms=N]
//                     [--http_listen=HOST:PORT] [--http_max_body_bytes=N]
//                     [--metrics_listen=HOST:PORT]
// Serves baton.v1.Baton (clients) and baton.v1.Coordinator (workers) on one
// port, plus the health service and reflection. --model names the model
// the workers serve; the coordinator reads only its tokenizer and limits.
// --http_listen adds the OpenAI-compatible HTTP API (coordinator/http/,
// docs/http.md), which calls the Baton service through gRPC's in-process
// channel. Stdout: "baton-coordinator listening on ADDR, model ID", then
// "baton-coordinator http on ADDR" and "baton-coordinator metrics on ADDR"
// when enabled (bound ports). Stops on SIGINT / SIGTERM.
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
#include "common/metrics/metrics.h"
#include "coordinator/http/openai_gateway.h"
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
ABSL_FLAG(std::string, http_listen, "",
          "host:port of the OpenAI-compatible HTTP API (port 0: any free "
          "port); empty: no HTTP API");
ABSL_FLAG(int64_t, http_max_body_bytes, int64_t{1} << 20,
          "HTTP request bodies above this size get 413");
ABSL_FLAG(int32_t, http_threads, 2, "I/O threads of the HTTP API");
ABSL_FLAG(int64_t, http_default_max_tokens, 1024,
          "max_tokens of a chat completion that sets none (capped by the "
          "context left after the prompt; 0: the whole rest of the context)");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port of a Prometheus /metrics listener; empty: none (the "
          "HTTP API also serves /metrics)");

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
  const int64_t context_length = (*cluster)->model().config().context_length;
  ControlPlaneService control_plane(cluster->get());
  BatonService api(cluster->get());

  auto running =
      StartServer(absl::GetFlag(FLAGS_listen), {&control_plane, &api});
  if (!running.ok()) {
    Log(running.status().ToString());
    return 1;
  }
  std::unique_ptr<grpc::Server> server = std::move(running->server);

  std::unique_ptr<http::OpenAiGateway> gateway;
  if (const std::string listen = absl::GetFlag(FLAGS_http_listen);
      !listen.empty()) {
    http::OpenAiGatewayOptions http_options;
    http_options.http.listen = listen;
    http_options.http.max_body_bytes = absl::GetFlag(FLAGS_http_max_body_bytes);
    http_options.http.threads = absl::GetFlag(FLAGS_http_threads);
    http_options.context_length = context_length;
    http_options.default_max_tokens =
        absl::GetFlag(FLAGS_http_default_max_tokens);
    const Cluster* served = cluster->get();
    http_options.token_bytes = [served](int32_t id) {
      const Tokenizer& tokenizer = served->model().tokenizer();
      return tokenizer.IsValidId(id) ? tokenizer.TokenToBytes(id)
                                     : std::string();
    };
    auto started = http::OpenAiGateway::Start(
        http_options, server->InProcessChannel(grpc::ChannelArguments()));
    if (!started.ok()) {
      Log(started.status().ToString());
      return started.status().code() == absl::StatusCode::kInvalidArgument ? 2
                                                                           : 1;
    }
    gateway = std::move(*started);
  }
  std::unique_ptr<metrics::MetricsServer> metrics_server;
  if (const std::string listen = absl::GetFlag(FLAGS_metrics_listen);
      !listen.empty()) {
    auto started = metrics::StartMetricsServer(listen);
    if (!started.ok()) {
      Log(started.status().ToString());
      return 1;
    }
    metrics_server = std::move(*started);
  }

  std::printf("baton-coordinator listening on %s, model %s\n",
              running->address.c_str(), model_id.c_str());
  if (gateway != nullptr) {
    std::printf("baton-coordinator http on %s\n", gateway->address().c_str());
  }
  if (metrics_server != nullptr) {
    std::printf("baton-coordinator metrics on %s\n",
                metrics_server->address().c_str());
  }
  std::fflush(stdout);

  Log(absl::StrCat("signal ", WaitForTerminationSignal(), ", stopping"));
  // Calls end first (their clients get UNAVAILABLE), then the HTTP API
  // (its in-process calls have ended), then the server (no handler runs
  // after it), then the cluster.
  (*cluster)->Shutdown();
  if (gateway != nullptr) gateway->Shutdown(absl::Seconds(2));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  gateway.reset();
  metrics_server.reset();
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
      "[--lease_ttl_ms=N] [--queue_timeout_ms=N] [--transfer_timeout_ms=N] "
      "[--http_listen=HOST:PORT] [--http_max_body_bytes=N] "
      "[--metrics_listen=HOST:PORT]");
  absl::ParseCommandLine(argc, argv);
  return baton::coordinator::Main();
}
