// `baton-worker`: one Engine behind the baton.v1.Worker gRPC service.
//   baton-worker --role=prefill|decode|both --listen=127.0.0.1:PORT
//                --model=PATH [--device=cpu|cuda:N] [--threads=N]
//                [--engine=cpu|simulated --profile=FILE]
//                [--kv_cache_mib=M]
//                [--kv_listen=127.0.0.1:0] [--coordinator=HOST:PORT]
//                [--metrics_listen=HOST:PORT]
//                [--tls_cert=PEM --tls_key=PEM --tls_ca=PEM [--kv_tls]]
// Serves the health service and reflection as well; with --coordinator it
// registers and heartbeats, retrying while the coordinator is unreachable;
// with --metrics_listen it serves Prometheus metrics at GET /metrics.
// With --device=cuda:N the weights and the KV pool (--kv_cache_mib) live on
// that GPU. After a device fault the worker refuses new requests
// (UNAVAILABLE), its health service reports NOT_SERVING and it deregisters
// from the coordinator. Stops on SIGINT / SIGTERM.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "baton/v1/worker.grpc.pb.h"
#include "common/fault/fault_points.h"
#include "common/grpc/serving.h"
#include "common/grpc/tls.h"
#include "common/metrics/metrics.h"
#include "common/metrics/metrics_server.h"
#include "common/mutex_checks.h"
#include "worker/engine/engine.h"
#include "worker/engine/model_bundle.h"
#include "worker/service/coordinator_membership.h"
#include "worker/service/device_flag.h"
#include "worker/service/engine_flags.h"
#include "worker/service/proto_convert.h"
#include "worker/service/registrar.h"
#include "worker/service/worker_lifecycle.h"
#include "worker/service/worker_service.h"
#include "worker/transport/kv_tls.h"
#if BATON_WORKER_CUDA
#include "worker/service/gpu_kv_paths.h"
#endif

ABSL_FLAG(std::string, role, "both", "prefill, decode or both");
ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "host:port of the Worker gRPC service (port 0: any free port)");
ABSL_FLAG(std::string, model, "", "GGUF file or HF folder");
ABSL_FLAG(std::string, device, "cpu",
          "where the engine computes: cpu, or cuda:N for GPU N (weights and "
          "the --kv_cache_mib KV pool in its memory)");
ABSL_FLAG(int32_t, threads, 1,
          "compute threads of the engine (with --device=cuda:N: host "
          "threads)");
ABSL_FLAG(std::string, prefix_cache, "on",
          "on: requests reuse the KV of the longest prefix an earlier request "
          "computed here (full blocks, content-addressed; tokens are "
          "identical either way); off: every prompt is prefilled whole");
ABSL_FLAG(int64_t, kv_cache_mib, 512,
          "KV pool size in MiB (on the GPU with --device=cuda:N)");
ABSL_FLAG(std::string, kv_listen, "127.0.0.1:0",
          "host:port of the TCP KV receiver (decode and both roles)");
ABSL_FLAG(int64_t, reservation_ttl_ms, 600000,
          "a KV reservation (ReserveKv) whose transfer has not started after "
          "this long is freed, unless the request sets its own TTL");
ABSL_FLAG(int64_t, max_queued_reservations, 256,
          "ReserveKv calls that may wait here for KV room at once, served in "
          "arrival order (ReserveKvRequest.queue_ms); more are refused with "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_waiting_requests, 1024,
          "Prefill calls are refused (RESOURCE_EXHAUSTED) while this many "
          "requests wait for the engine (0: no bound)");
ABSL_FLAG(int64_t, kv_stall_timeout_ms, 10000,
          "a TCP KV connection that makes no progress for this long fails "
          "its transfer, on the sending and on the receiving side");
ABSL_FLAG(bool, kv_tls, false,
          "the TCP KV connections this worker opens and accepts are mutual "
          "TLS 1.3 with --tls_cert/--tls_key/--tls_ca (every worker of a "
          "cluster sets it alike); off: the KV payload crosses the network "
          "in the clear, authenticated per transfer but not encrypted");
ABSL_FLAG(std::string, fault, "",
          "fault injection for tests: POINT:ACTION[@N],... makes the N-th "
          "hit (default 1, counted after the warm-up) of a fault point crash "
          "the worker, stop it (SIGSTOP), fail there or block the engine "
          "for good (actions crash, stop, error, hang; points prefill_step, "
          "decode_step; see "
          "common/fault/fault_points.h); empty: off");
ABSL_FLAG(std::string, coordinator, "",
          "host:port of baton-coordinator's control plane (its "
          "--control_listen), or a comma-separated list of them: several "
          "coordinator replicas serving one cluster, each registered with "
          "and heartbeated. A host that is a DNS name stands for every "
          "address it resolves to (e.g. a headless Service), looked up again "
          "every --coordinator_resolve_s. Empty: run standalone");
ABSL_FLAG(std::string, health_listen, "",
          "host:port of a plaintext server with only grpc.health.v1, "
          "following the worker's health (for probes that speak no TLS, "
          "such as Kubernetes'); empty: none");
ABSL_FLAG(int64_t, coordinator_resolve_s, 10,
          "how often a DNS name in --coordinator is looked up again");
ABSL_FLAG(std::string, worker_id, "",
          "this worker's stable name with every coordinator (1-64 of "
          "[A-Za-z0-9._-]); empty: a random one, 'w-' and 8 hex digits, "
          "drawn at start");
// Mutual TLS on the control plane (common/grpc/tls.h, docs/security.md):
// the worker's port requires a client certificate from --tls_ca, and the
// worker presents --tls_cert to the coordinator and to other workers.
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of this worker (served on --listen, "
          "presented to the coordinator and peers); empty: plaintext");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle of the cluster: the coordinator and peer workers "
          "must present a certificate it signed (required with --tls_cert)");
ABSL_FLAG(int64_t, tls_reload_s, 60,
          "certificate, key and CA files are re-read this often (seconds)");
ABSL_FLAG(int64_t, drain_timeout_s, 30,
          "on SIGTERM or SIGINT: stop taking requests (health NOT_SERVING, "
          "DRAINING at the coordinator) and let those in flight finish for "
          "up to this long before stopping; 0 stops at once; a second "
          "signal ends the drain");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port serving Prometheus metrics at GET /metrics (port 0: any "
          "free port); empty: no metrics listener");

namespace baton {
namespace {

void Log(const std::string& line) {
  std::fprintf(stderr, "baton-worker: %s\n", line.c_str());
}

absl::StatusOr<v1::WorkerRole> ParseRole(const std::string& role) {
  if (role == "prefill") return v1::WORKER_ROLE_PREFILL;
  if (role == "decode") return v1::WORKER_ROLE_DECODE;
  if (role == "both") return v1::WORKER_ROLE_BOTH;
  return absl::InvalidArgumentError(
      absl::StrCat("--role: '", role, "' is not one of prefill, decode, both"));
}

absl::Status SplitHostPort(const std::string& address, std::string* host,
                           int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), port) || *port < 0 ||
      *port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", address, "' is not HOST:PORT"));
  }
  *host = address.substr(0, colon);
  return absl::OkStatus();
}

// Set once a stop begins: a registration after it does not turn the
// worker SERVING again.
std::atomic<bool> stopping{false};

int Main() {
  // Signals are taken by WaitForTerminationSignal below.
  BlockTerminationSignals();

  auto role = ParseRole(absl::GetFlag(FLAGS_role));
  if (!role.ok()) {
    Log(role.status().ToString());
    return 2;
  }
  auto device = ParseDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) {
    Log(device.status().ToString());
    return 2;
  }
#if !BATON_WORKER_CUDA
  if (device->kind == DeviceSpec::Kind::kCuda) {
    Log(absl::StrCat("--device=", device->ToString(),
                     ": this baton-worker was built without CUDA "
                     "(configure with -DBATON_CUDA=ON)"));
    return 2;
  }
#endif
  const std::string model_path = absl::GetFlag(FLAGS_model);
  if (model_path.empty()) {
    Log("--model is required");
    return 2;
  }
  std::string kv_host;
  int kv_port = 0;
  if (absl::Status s =
          SplitHostPort(absl::GetFlag(FLAGS_kv_listen), &kv_host, &kv_port);
      !s.ok()) {
    Log(absl::StrCat("--kv_listen: ", s.message()));
    return 2;
  }
  std::string listen_host;
  int listen_port = 0;
  if (absl::Status s = SplitHostPort(absl::GetFlag(FLAGS_listen), &listen_host,
                                     &listen_port);
      !s.ok()) {
    Log(absl::StrCat("--listen: ", s.message()));
    return 2;
  }
  if (const std::string listen = absl::GetFlag(FLAGS_metrics_listen);
      !listen.empty()) {
    std::string metrics_host;
    int metrics_port = 0;
    if (absl::Status s = SplitHostPort(listen, &metrics_host, &metrics_port);
        !s.ok()) {
      Log(absl::StrCat("--metrics_listen: ", s.message()));
      return 2;
    }
  }
  const TlsFiles tls{
      absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
      absl::GetFlag(FLAGS_tls_ca),
      absl::Seconds(std::max<int64_t>(1, absl::GetFlag(FLAGS_tls_reload_s)))};
  if (tls.enabled() && (tls.cert.empty() || tls.ca.empty())) {
    Log("the control plane is mutual TLS: --tls_cert, --tls_key and --tls_ca "
        "go together");
    return 2;
  }
  auto control_credentials = MakeChannelCredentials(tls, "--tls");
  if (!control_credentials.ok()) {
    Log(control_credentials.status().ToString());
    return 2;
  }
  auto coordinators = ParseCoordinatorList(absl::GetFlag(FLAGS_coordinator));
  if (!coordinators.ok()) {
    Log(coordinators.status().ToString());
    return 2;
  }
  auto faults = ParseFaultSpecs(absl::GetFlag(FLAGS_fault));
  if (!faults.ok()) {
    Log(absl::StrCat("--fault: ", faults.status().message()));
    return 2;
  }
  if (absl::GetFlag(FLAGS_threads) < 1 ||
      absl::GetFlag(FLAGS_kv_cache_mib) < 1) {
    Log("--threads and --kv_cache_mib must be >= 1");
    return 2;
  }

  auto bundle = LoadModelBundle(model_path);
  if (!bundle.ok()) {
    Log(bundle.status().ToString());
    return 1;
  }
  const std::string prefix_cache = absl::GetFlag(FLAGS_prefix_cache);
  if (prefix_cache != "on" && prefix_cache != "off") {
    Log(absl::StrCat("--prefix_cache must be on or off, got '", prefix_cache,
                     "'"));
    return 2;
  }
  const std::string model_id =
      !bundle->weights->config().name.empty()
          ? bundle->weights->config().name
          : std::filesystem::path(model_path).stem().string();
  EngineOptions engine_options;
  engine_options.prefix_cache = prefix_cache == "on";
  engine_options.model_id = model_id;
  engine_options.num_threads = absl::GetFlag(FLAGS_threads);
  engine_options.kv_cache_bytes =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_kv_cache_mib)) << 20;
#if BATON_WORKER_CUDA
  if (device->kind == DeviceSpec::Kind::kCuda) {
    auto runner = CudaRunnerFromFlags(device->index);
    if (!runner.ok()) {
      Log(std::string(runner.status().message()));
      return 2;
    }
    engine_options.make_runner = *std::move(runner);
  }
#endif
  std::optional<WorkerProfile> simulated_kv;  // --simulate_kv_transfers
  if (absl::Status s = ApplyEngineFlags(device->kind != DeviceSpec::Kind::kCpu,
                                        &engine_options, &simulated_kv);
      !s.ok()) {
    Log(std::string(s.message()));
    return 2;
  }
  auto engine = Engine::Create(engine_options, bundle->weights.get(),
                               bundle->tokenizer.get());
  if (!engine.ok()) {
    Log(absl::StrCat("--device=", device->ToString(), ": ",
                     engine.status().ToString()));
    return 1;
  }
  if (absl::Status s = WarmUp(**engine); !s.ok()) {
    Log(absl::StrCat("warm-up failed: ", s.ToString()));
    return 1;
  }
  FaultPoints::Global().Arm(std::move(*faults));
  const ModelConfig& config = (*engine)->config();
  WorkerServiceOptions options;
  options.role = *role;
  options.model_id = model_id;
  options.kv_host = kv_host;
  options.kv_port = kv_port;
  if (absl::GetFlag(FLAGS_reservation_ttl_ms) < 1) {
    Log("--reservation_ttl_ms must be >= 1");
    return 2;
  }
  options.reservation_ttl =
      absl::Milliseconds(absl::GetFlag(FLAGS_reservation_ttl_ms));
  if (absl::GetFlag(FLAGS_max_queued_reservations) < 0) {
    Log("--max_queued_reservations must be >= 0");
    return 2;
  }
  options.max_queued_reservations =
      static_cast<size_t>(absl::GetFlag(FLAGS_max_queued_reservations));
  options.max_waiting_requests = absl::GetFlag(FLAGS_max_waiting_requests);
  if (options.max_waiting_requests < 0) {
    Log("--max_waiting_requests must be >= 0 (0: no bound)");
    return 2;
  }
  if (absl::GetFlag(FLAGS_kv_stall_timeout_ms) < 1) {
    Log("--kv_stall_timeout_ms must be >= 1");
    return 2;
  }
  options.kv_stall_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_kv_stall_timeout_ms));
  if (absl::GetFlag(FLAGS_kv_tls)) {
    auto kv_tls =
        KvTls::Create({tls.cert, tls.key, tls.ca, tls.reload_interval});
    if (!kv_tls.ok()) {
      Log(kv_tls.status().ToString());
      return 2;
    }
    options.kv_tls = std::move(*kv_tls);
  }
  options.peer_credentials = *control_credentials;
  options.simulated_kv_transfers = std::move(simulated_kv);
#if BATON_WORKER_CUDA
  // A GPU worker also hands KV device to device: CUDA IPC with workers on
  // its GPU, NCCL with workers on others (the sender picks; TCP otherwise).
  std::unique_ptr<GpuKvPaths> gpu_kv;
  if (device->kind == DeviceSpec::Kind::kCuda) {
    auto paths = GpuKvPaths::Create(engine->get(), device->index, kv_host,
                                    *role, &options);
    if (!paths.ok()) {
      Log(paths.status().ToString());
      return 1;
    }
    gpu_kv = std::move(*paths);
  }
#endif
  auto service = WorkerService::Create(options, engine->get());
  if (!service.ok()) {
    Log(service.status().ToString());
    return 1;
  }

  auto running =
      StartServer(absl::GetFlag(FLAGS_listen),
                  {{service->get(), v1::Worker::service_full_name()}}, 4 << 20,
                  tls, "--tls",
                  // With coordinators: NOT_SERVING until one knows this
                  // worker (readiness means registered).
                  /*serving=*/coordinators->empty());
  if (!running.ok()) {
    Log(running.status().ToString());
    return 1;
  }
  std::unique_ptr<grpc::Server> server = std::move(running->server);
  const std::string address = running->address;
  (*service)->SetWorkerRef("", address);
  std::printf("baton-worker %s listening on %s, kv %s, model %s, device %s\n",
              absl::GetFlag(FLAGS_role).c_str(), address.c_str(),
              (*service)->kv_endpoint().c_str(), options.model_id.c_str(),
              (*engine)->device_name().c_str());
  std::fflush(stdout);

  // With coordinators: NOT_SERVING until one knows this worker.
  HealthStatus health(/*serving=*/coordinators->empty());
  health.Add(server.get());
  std::unique_ptr<grpc::Server> health_server;
  if (const std::string listen = absl::GetFlag(FLAGS_health_listen);
      !listen.empty()) {
    auto started = StartHealthServer(listen, health.serving());
    if (!started.ok()) {
      Log(absl::StrCat("--health_listen: ", started.status().ToString()));
      server->Shutdown(std::chrono::system_clock::now());
      return 1;
    }
    health_server = std::move(started->server);
    health.Add(health_server.get());
    std::printf("baton-worker health on %s\n", started->address.c_str());
    std::fflush(stdout);
  }

  std::unique_ptr<metrics::MetricsServer> metrics_server;
  if (const std::string listen = absl::GetFlag(FLAGS_metrics_listen);
      !listen.empty()) {
    auto started = metrics::StartMetricsServer(listen);
    if (!started.ok()) {
      Log(absl::StrCat("--metrics_listen: ", started.status().ToString()));
      server->Shutdown(std::chrono::system_clock::now());
      return 1;
    }
    metrics_server = std::move(*started);
    std::printf("baton-worker metrics on %s\n",
                metrics_server->address().c_str());
    std::fflush(stdout);
  }

  std::unique_ptr<CoordinatorMembership> membership;
  if (!coordinators->empty()) {
    v1::RegisterWorkerRequest request;
    request.set_role(*role);
    // A stable name and a fresh incarnation: coordinators (restarted ones
    // too) all name this worker the same, and know a restart when they
    // see one.
    SetWorkerIdentity(absl::GetFlag(FLAGS_worker_id), &request);
    request.set_address(address);
    request.set_model_id(options.model_id);
    *request.mutable_kv_layout() = ToProto((*engine)->kv_cache().layout());
    request.set_kv_blocks_total((*engine)->stats().kv_blocks_total);
    if ((*engine)->prefix_cache_enabled()) {
      const BlockHash root = (*engine)->prefix_root();
      request.set_prefix_root(PackHashes({&root, 1}));
    }
    if (!options.kv_device.empty()) {
      request.add_kv_transports(v1::KV_TRANSPORT_CUDA_IPC);
      request.add_kv_transports(v1::KV_TRANSPORT_NCCL);
      request.set_kv_device(options.kv_device);
    }
    request.add_kv_transports(v1::KV_TRANSPORT_HOST_TCP);
    request.set_context_length(static_cast<int32_t>(config.context_length));
    request.set_vocab_size(static_cast<int32_t>(config.vocab_size));
    request.set_architecture(config.architecture);
    Engine* engine_ptr = engine->get();
    WorkerService* service_ptr = service->get();
    std::shared_ptr<grpc::ChannelCredentials> credentials =
        *control_credentials;
    HealthStatus* health_ptr = &health;
    auto on_registered = [engine_ptr, health_ptr] {
      if (!stopping.load() && engine_ptr->health().ok()) {
        health_ptr->Set(true);
      }
    };
    membership = std::make_unique<CoordinatorMembership>(
        *std::move(coordinators),
        [request, engine_ptr, service_ptr, credentials, on_registered](
            const std::string& address, const std::string& server_name) {
          return std::make_unique<Registrar>(
              address, request, service_ptr,
              [engine_ptr] { return engine_ptr->health(); }, credentials,
              server_name, on_registered);
        },
        absl::Seconds(
            std::max<int64_t>(1, absl::GetFlag(FLAGS_coordinator_resolve_s))));
  }
  auto health_watch = std::make_unique<HealthWatch>(engine->get(), &health);

  const int signal_number = WaitForTerminationSignal();
  stopping.store(true);
  DrainWorker(signal_number,
              absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_s)), &health,
              service->get(), membership.get());
  membership.reset();
  health_watch.reset();
  metrics_server.reset();
  if (health_server != nullptr) {
    health_server->Shutdown(std::chrono::system_clock::now());
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
#if BATON_WORKER_CUDA
  // No PairKv can arrive now; the NCCL receiver's last callbacks still
  // reach the service (on_landed) and the engine.
  if (gpu_kv != nullptr) gpu_kv->StopReceiving();
#endif
  service->reset();
  engine->reset();
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "baton-worker --role=prefill|decode|both --listen=HOST:PORT "
      "--model=PATH [--device=cpu|cuda:N] [--threads=N] [--kv_cache_mib=M] "
      "[--kv_listen=HOST:PORT] "
      "[--coordinator=HOST:PORT] [--metrics_listen=HOST:PORT]");
  absl::ParseCommandLine(argc, argv);
  baton::ApplyMutexChecksFlag();
  return baton::Main();
}
