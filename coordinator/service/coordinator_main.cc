// `baton-coordinator`: the cluster's front door and control plane.
//   baton-coordinator --listen=127.0.0.1:PORT --control_listen=127.0.0.1:PORT
//                     --model=PATH
//                     [--policy=least_loaded|round_robin]
//                     [--heartbeat_ms=N] [--lease_ttl_ms=N]
//                     [--engine_stall_timeout_ms=N]
//                     [--queue_timeout_ms=N] [--transfer_timeout_ms=N]
//                     [--max_attempts=N] [--max_migrations=N]
//                     [--overlap_reserve_kv=true|false]
//                     [--local_prefill_tokens=N] [--ttft_slo_ms=N]
//                     [--max_waiting_requests=N] [--max_running_requests=N]
//                     [--http_listen=HOST:PORT] [--http_max_body_bytes=N]
//                     [--metrics_listen=HOST:PORT]
//                     [--tls_cert=PEM --tls_key=PEM [--tls_client_ca=PEM]]
//                     [--control_tls_cert=PEM --control_tls_key=PEM
//                      --control_tls_ca=PEM] [--api_keys_file=PATH]
// Two planes on two ports, each with the health service and reflection:
// --listen serves baton.v1.Baton (clients; the public plane), and
// --control_listen serves baton.v1.Coordinator (workers; the control
// plane). Nothing of the control plane answers on the public port (see
// docs/security.md for every port and who may call it). --model names the model
// the workers serve; the coordinator reads only its tokenizer and limits.
// --http_listen adds the OpenAI-compatible HTTP API (coordinator/http/,
// docs/http.md), which calls the Baton service through gRPC's in-process
// channel. Stdout: "baton-coordinator listening on ADDR, control ADDR,
// model ID", then
// "baton-coordinator http on ADDR" and "baton-coordinator metrics on ADDR"
// when enabled (bound ports). Stops on SIGINT / SIGTERM.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/auth/api_keys.h"
#include "common/auth/bearer_interceptor.h"
#include "common/grpc/serving.h"
#include "common/grpc/tls.h"
#include "common/metrics/metrics.h"
#include "common/metrics/metrics_server.h"
#include "common/mutex_checks.h"
#include "coordinator/http/openai_gateway.h"
#include "coordinator/service/cluster.h"
#include "coordinator/service/coordinator_services.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "host:port of the public Baton API (clients; port 0: any free "
          "port)");
ABSL_FLAG(std::string, control_listen, "127.0.0.1:50052",
          "host:port of the control plane, the Coordinator service that "
          "workers register and heartbeat with (port 0: any free port); "
          "never served on --listen");
ABSL_FLAG(std::string, model, "",
          "GGUF file or HF folder of the served model (tokenizer and limits)");
ABSL_FLAG(double, prefix_weight, 1.0,
          "least_loaded prefill routing: worker cost = queued prompt tokens "
          "+ this prompt's tokens - prefix_weight x the tokens of it the "
          "worker's prefix cache holds (1: a cached token saves what a "
          "queued one costs; 0: ignore the cache)");
ABSL_FLAG(std::string, policy, "least_loaded", "least_loaded or round_robin");
ABSL_FLAG(int64_t, heartbeat_ms, 500, "workers heartbeat this often");
ABSL_FLAG(int64_t, lease_ttl_ms, 3000,
          "a worker without a heartbeat for this long is down");
ABSL_FLAG(int64_t, engine_stall_timeout_ms, 60000,
          "a worker whose heartbeats show running sequences or queued prompt "
          "tokens but no engine step for this long is wedged: it goes down "
          "(its requests fail or migrate) and gets no new requests until its "
          "engine moves again (0: never)");
ABSL_FLAG(int64_t, queue_timeout_ms, 30000,
          "how long a request waits for a decode worker with free KV blocks");
ABSL_FLAG(int64_t, transfer_timeout_ms, 30000,
          "a KV transfer that takes longer fails the request");
ABSL_FLAG(int32_t, max_attempts, 3,
          "attempts a request may take before its first token reaches the "
          "client, when a worker fails the others (>= 1)");
ABSL_FLAG(int32_t, max_migrations, 2,
          "times a request whose decode worker fails after tokens were "
          "streamed continues on another decode worker (0: never)");
ABSL_FLAG(bool, overlap_reserve_kv, true,
          "split serving: send Prefill at once and reserve the decode "
          "worker's KV beside it (one round trip less before the first "
          "token; decode workers with host KV only); false: reserve "
          "first");
ABSL_FLAG(int64_t, local_prefill_tokens, 0,
          "split serving: a request whose prompt a decode worker with room "
          "holds all but at most this many tokens of (at least one KV block "
          "in its prefix cache) is served on that decode worker, which "
          "prefills the rest itself: no prefill worker and no KV transfer "
          "(a conversation's next turn; the decode worker then computes "
          "it, beside its decodes); 0: always split");
ABSL_FLAG(int64_t, ttft_slo_ms, 0,
          "refuse a request at once (RESOURCE_EXHAUSTED, HTTP 429 with "
          "Retry-After) when its estimated time to first token, from the "
          "prompt tokens queued on the prefill workers and their measured "
          "prefill rate, is above this (0: no estimate-based refusal)");
ABSL_FLAG(int64_t, max_running_requests, 16384,
          "refuse a request at once (RESOURCE_EXHAUSTED) while this many "
          "admitted requests have not ended, whatever their phase: a bound "
          "on the streams the coordinator holds (0: no bound)");
ABSL_FLAG(int64_t, max_waiting_requests, 1024,
          "requests admitted and not yet at their first token, at most; one "
          "more is refused at once (RESOURCE_EXHAUSTED, HTTP 429; 0: no "
          "bound)");
ABSL_FLAG(std::string, http_listen, "",
          "host:port of the OpenAI-compatible HTTP API (port 0: any free "
          "port); empty: no HTTP API");
ABSL_FLAG(int64_t, http_max_body_bytes, int64_t{1} << 20,
          "HTTP request bodies above this size get 413");
ABSL_FLAG(int32_t, http_threads, 2, "I/O threads of the HTTP API");
ABSL_FLAG(int64_t, http_default_max_tokens, 1024,
          "max_tokens of a chat completion that sets none (capped by the "
          "context left after the prompt; 0: the whole rest of the context)");
ABSL_FLAG(int32_t, max_receive_bytes, 4 << 20,
          "largest gRPC message the public port accepts (bigger: "
          "RESOURCE_EXHAUSTED)");
// Request limits (coordinator/service/request_limits.h): over one, a request
// is INVALID_ARGUMENT (HTTP 400) naming the field and the limit.
ABSL_FLAG(int64_t, max_request_id_bytes, 128, "bytes of a client's request_id");
ABSL_FLAG(int64_t, max_stop_strings, 16, "stop strings of one request");
ABSL_FLAG(int64_t, max_stop_string_bytes, 256, "bytes of one stop string");
ABSL_FLAG(int64_t, max_stop_bytes_total, 1024,
          "bytes of one request's stop strings together");
ABSL_FLAG(int64_t, max_stop_token_ids, 64, "stop token ids of one request");
ABSL_FLAG(int64_t, max_prompt_bytes, int64_t{1} << 20,
          "bytes of a prompt's text (chat messages together), before "
          "tokenization");
ABSL_FLAG(int64_t, max_chat_messages, 1024, "messages of a chat prompt");
ABSL_FLAG(int64_t, max_prompt_tokens, 0,
          "tokens of a prompt; 0: the model's context length");
// TLS (common/grpc/tls.h, docs/security.md): plaintext without files.
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of the public port (gRPC and --http_listen); "
          "empty: plaintext");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: public clients must present a certificate it "
          "signed (mutual TLS); empty: no client certificate asked");
ABSL_FLAG(std::string, control_tls_cert, "",
          "PEM certificate chain of the control plane: served on "
          "--control_listen and presented to workers; empty: plaintext");
ABSL_FLAG(std::string, control_tls_key, "",
          "PEM private key of --control_tls_cert");
ABSL_FLAG(std::string, control_tls_ca, "",
          "PEM CA bundle of the cluster: workers must present a certificate "
          "it signed, and the workers' ports must too (mutual TLS; required "
          "with --control_tls_cert)");
ABSL_FLAG(int64_t, tls_reload_s, 60,
          "certificate, key and CA files are re-read this often (seconds)");
ABSL_FLAG(std::string, api_keys_file, "",
          "file of API keys, one per line ('#' comments), re-read when it "
          "changes: every public call then needs 'authorization: Bearer "
          "KEY' (HTTP: the Authorization header); empty: no keys");
ABSL_FLAG(std::string, api_keys_open_paths, "/health,/metrics",
          "HTTP paths served without a key when --api_keys_file is set "
          "(comma-separated; empty: none)");
ABSL_FLAG(int64_t, drain_timeout_s, 30,
          "on SIGTERM or SIGINT: refuse new requests (health NOT_SERVING) and "
          "let running ones finish for up to this long; then end the rest "
          "(finish_reason cancelled for streams under way)");
ABSL_FLAG(std::string, health_listen, "",
          "host:port of a plaintext server with only grpc.health.v1, "
          "following the coordinator's health (for probes that speak no "
          "TLS, such as Kubernetes'); empty: none");
ABSL_FLAG(std::string, coordinator_id, "",
          "this replica's id among several coordinators serving one cluster "
          "(letters, digits, '-', '_', at most 64); it tags the leases it "
          "takes on workers. Empty: c- and 8 random hex digits");
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
  options.prefix_weight = absl::GetFlag(FLAGS_prefix_weight);
  options.coordinator_id = absl::GetFlag(FLAGS_coordinator_id);
  if (options.coordinator_id.size() > 64 ||
      !std::all_of(options.coordinator_id.begin(), options.coordinator_id.end(),
                   [](char c) {
                     return absl::ascii_isalnum(
                                static_cast<unsigned char>(c)) ||
                            c == '-' || c == '_';
                   })) {
    Log(absl::StrCat("--coordinator_id: '", options.coordinator_id,
                     "' must be at most 64 letters, digits, '-' or '_'"));
    return 1;
  }
  options.registry.heartbeat_interval = absl::Milliseconds(heartbeat_ms);
  options.registry.lease_ttl = absl::Milliseconds(lease_ms);
  // Epochs never repeat across restarts: they start at this start's time.
  options.registry.first_epoch =
      static_cast<uint64_t>(absl::ToUnixMicros(absl::Now()));
  options.registry.suspect_after = absl::Milliseconds(
      std::max(heartbeat_ms * 2, (heartbeat_ms + lease_ms) / 2));
  if (options.registry.suspect_after >= options.registry.lease_ttl) {
    options.registry.suspect_after = options.registry.heartbeat_interval;
  }
  const int64_t stall_ms = absl::GetFlag(FLAGS_engine_stall_timeout_ms);
  if (stall_ms < 0) {
    Log("--engine_stall_timeout_ms must be >= 0 (0: no stall check)");
    return 2;
  }
  options.registry.engine_stall_after =
      stall_ms == 0 ? absl::InfiniteDuration() : absl::Milliseconds(stall_ms);
  options.queue_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_queue_timeout_ms));
  options.transfer_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_transfer_timeout_ms));
  options.max_migrations = absl::GetFlag(FLAGS_max_migrations);
  options.max_attempts = absl::GetFlag(FLAGS_max_attempts);
  options.overlap_reserve_kv = absl::GetFlag(FLAGS_overlap_reserve_kv);
  options.local_prefill_tokens = absl::GetFlag(FLAGS_local_prefill_tokens);
  if (options.local_prefill_tokens < 0) {
    Log("--local_prefill_tokens must be >= 0 (0: always split)");
    return 2;
  }
  options.admission.ttft_slo =
      absl::Milliseconds(absl::GetFlag(FLAGS_ttft_slo_ms));
  options.admission.max_waiting_requests =
      absl::GetFlag(FLAGS_max_waiting_requests);
  options.admission.max_running_requests =
      absl::GetFlag(FLAGS_max_running_requests);
  RequestLimits& limits = options.limits;
  limits.max_request_id_bytes = absl::GetFlag(FLAGS_max_request_id_bytes);
  limits.max_stop_strings = absl::GetFlag(FLAGS_max_stop_strings);
  limits.max_stop_string_bytes = absl::GetFlag(FLAGS_max_stop_string_bytes);
  limits.max_stop_bytes_total = absl::GetFlag(FLAGS_max_stop_bytes_total);
  limits.max_stop_token_ids = absl::GetFlag(FLAGS_max_stop_token_ids);
  limits.max_prompt_bytes = absl::GetFlag(FLAGS_max_prompt_bytes);
  limits.max_chat_messages = absl::GetFlag(FLAGS_max_chat_messages);
  limits.max_prompt_tokens = absl::GetFlag(FLAGS_max_prompt_tokens);
  if (limits.max_request_id_bytes < 1 || limits.max_request_id_bytes > 128) {
    Log("--max_request_id_bytes must be in [1, 128] (the KV transfer header "
        "holds the id with its cluster-wide suffix)");
    return 2;
  }
  if (absl::GetFlag(FLAGS_max_receive_bytes) < 1024) {
    Log("--max_receive_bytes must be >= 1024");
    return 2;
  }
  const absl::Duration reload =
      absl::Seconds(std::max<int64_t>(1, absl::GetFlag(FLAGS_tls_reload_s)));
  TlsFiles public_tls{absl::GetFlag(FLAGS_tls_cert),
                      absl::GetFlag(FLAGS_tls_key),
                      absl::GetFlag(FLAGS_tls_client_ca), reload};
  TlsFiles control_tls{absl::GetFlag(FLAGS_control_tls_cert),
                       absl::GetFlag(FLAGS_control_tls_key),
                       absl::GetFlag(FLAGS_control_tls_ca), reload};
  if (control_tls.enabled() &&
      (control_tls.cert.empty() || control_tls.ca.empty())) {
    Log("the control plane is mutual TLS: --control_tls_cert, "
        "--control_tls_key and --control_tls_ca go together");
    return 2;
  }
  for (const auto& [files, prefix] :
       {std::pair{&public_tls, "--tls"},
        std::pair{&control_tls, "--control_tls"}}) {
    if (absl::Status s = CheckTlsFiles(*files, /*server=*/true, prefix);
        !s.ok()) {
      Log(s.ToString());
      return 2;
    }
  }
  auto worker_credentials =
      MakeChannelCredentials(control_tls, "--control_tls");
  if (!worker_credentials.ok()) {
    Log(worker_credentials.status().ToString());
    return 2;
  }
  options.worker_credentials = *worker_credentials;
  std::unique_ptr<ApiKeys> api_keys;
  if (const std::string path = absl::GetFlag(FLAGS_api_keys_file);
      !path.empty()) {
    auto loaded = ApiKeys::Load(path);
    if (!loaded.ok()) {
      Log(loaded.status().ToString());
      return 2;
    }
    api_keys = std::move(*loaded);
  }
  auto cluster = Cluster::Create(options, std::move(*model), RealClock());
  if (!cluster.ok()) {
    Log(cluster.status().ToString());
    return 2;
  }
  const int64_t context_length = (*cluster)->model().config().context_length;
  ControlPlaneService control_plane(cluster->get());
  BatonService api(cluster->get(), api_keys.get());

  auto running = StartServer(
      absl::GetFlag(FLAGS_listen), {{&api, v1::Baton::service_full_name()}},
      absl::GetFlag(FLAGS_max_receive_bytes), public_tls, "--tls");
  if (!running.ok()) {
    Log(absl::StrCat("--listen: ", running.status().ToString()));
    return 1;
  }
  std::unique_ptr<grpc::Server> server = std::move(running->server);
  auto control =
      StartServer(absl::GetFlag(FLAGS_control_listen),
                  {{&control_plane, v1::Coordinator::service_full_name()}},
                  4 << 20, control_tls, "--control_tls");
  if (!control.ok()) {
    Log(absl::StrCat("--control_listen: ", control.status().ToString()));
    return 1;
  }
  std::unique_ptr<grpc::Server> control_server = std::move(control->server);
  HealthStatus health(/*serving=*/true);
  health.Add(server.get());
  health.Add(control_server.get());
  std::unique_ptr<grpc::Server> health_server;
  std::string health_address;
  if (const std::string listen = absl::GetFlag(FLAGS_health_listen);
      !listen.empty()) {
    auto started = StartHealthServer(listen, /*serving=*/true);
    if (!started.ok()) {
      Log(absl::StrCat("--health_listen: ", started.status().ToString()));
      return 1;
    }
    health_server = std::move(started->server);
    health_address = started->address;
    health.Add(health_server.get());
  }

  std::unique_ptr<http::OpenAiGateway> gateway;
  if (const std::string listen = absl::GetFlag(FLAGS_http_listen);
      !listen.empty()) {
    http::OpenAiGatewayOptions http_options;
    http_options.http.listen = listen;
    http_options.http.max_body_bytes = absl::GetFlag(FLAGS_http_max_body_bytes);
    http_options.http.threads = absl::GetFlag(FLAGS_http_threads);
    http_options.http.tls = public_tls;
    http_options.api_keys = api_keys.get();
    http_options.open_paths = absl::StrSplit(
        absl::GetFlag(FLAGS_api_keys_open_paths), ',', absl::SkipEmpty());
    http_options.context_length = context_length;
    http_options.default_max_tokens =
        absl::GetFlag(FLAGS_http_default_max_tokens);
    const Cluster* served = cluster->get();
    http_options.token_bytes = [served](int32_t id) {
      const Tokenizer& tokenizer = served->model().tokenizer();
      return tokenizer.IsValidId(id) ? tokenizer.TokenToBytes(id)
                                     : std::string();
    };
    // The gateway checks the HTTP caller's key itself and calls the API
    // with the process key.
    auto started = http::OpenAiGateway::Start(
        http_options,
        server->experimental().InProcessChannelWithInterceptors(
            grpc::ChannelArguments(),
            BearerInterceptors(api_keys != nullptr ? api_keys->process_key()
                                                   : std::string())));
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

  std::printf("baton-coordinator listening on %s, control %s, model %s\n",
              running->address.c_str(), control->address.c_str(),
              model_id.c_str());
  if (gateway != nullptr) {
    std::printf("baton-coordinator http on %s\n", gateway->address().c_str());
  }
  if (metrics_server != nullptr) {
    std::printf("baton-coordinator metrics on %s\n",
                metrics_server->address().c_str());
  }
  if (health_server != nullptr) {
    std::printf("baton-coordinator health on %s\n", health_address.c_str());
  }
  std::fflush(stdout);

  const int signal_number = WaitForTerminationSignal();
  // Drain: NOT_SERVING on both planes, new requests refused (UNAVAILABLE),
  // the running ones finish for up to --drain_timeout_s.
  health.Set(false);
  const absl::Duration drain =
      absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_s));
  Log(absl::StrCat(
      "signal ", signal_number,
      drain > absl::ZeroDuration()
          ? absl::StrCat(", draining for up to ", absl::FormatDuration(drain))
          : ", stopping"));
  const int left = (*cluster)->Drain(drain);
  Log(left == 0 ? std::string("drained; stopping")
                : absl::StrCat(left, " request(s) still running; ending them"));
  // The calls left end next (cancelled once streaming, UNAVAILABLE before),
  // then the HTTP API (its in-process calls have ended), then the server
  // (no handler runs after it), then the cluster.
  (*cluster)->Shutdown();
  if (gateway != nullptr) gateway->Shutdown(absl::Seconds(2));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  control_server->Shutdown(std::chrono::system_clock::now() +
                           std::chrono::seconds(2));
  if (health_server != nullptr) {
    health_server->Shutdown(std::chrono::system_clock::now());
  }
  gateway.reset();
  metrics_server.reset();
  server.reset();
  control_server.reset();
  cluster->reset();
  return 0;
}

}  // namespace
}  // namespace baton::coordinator

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "baton-coordinator --listen=HOST:PORT --control_listen=HOST:PORT "
      "--model=PATH "
      "[--policy=least_loaded|round_robin] [--heartbeat_ms=N] "
      "[--lease_ttl_ms=N] [--engine_stall_timeout_ms=N] [--queue_timeout_ms=N] "
      "[--transfer_timeout_ms=N] "
      "[--max_attempts=N] [--max_migrations=N] "
      "[--overlap_reserve_kv=true|false] [--local_prefill_tokens=N] "
      "[--ttft_slo_ms=N] "
      "[--max_waiting_requests=N] [--max_running_requests=N] "
      "[--http_listen=HOST:PORT] [--http_max_body_bytes=N] "
      "[--metrics_listen=HOST:PORT] [--tls_cert=PEM --tls_key=PEM "
      "[--tls_client_ca=PEM]] [--control_tls_cert=PEM --control_tls_key=PEM "
      "--control_tls_ca=PEM] [--api_keys_file=PATH]");
  absl::ParseCommandLine(argc, argv);
  baton::ApplyMutexChecksFlag();
  return baton::coordinator::Main();
}
