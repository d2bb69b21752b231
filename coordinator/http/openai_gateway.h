// The OpenAI-compatible HTTP front door of baton-coordinator:
//   POST /v1/chat/completions, POST /v1/completions   (JSON or SSE)
//   GET  /v1/models, GET /v1/models/{id}
//   GET  /health    200 when the cluster can serve (a healthy prefill and
//                   decode worker, or a healthy `both` worker), else 503
//   GET  /metrics   the process's Prometheus registry
// Every model and generation request goes through the coordinator's own
// baton.v1.Baton service over gRPC's in-process channel, so HTTP and gRPC
// clients get the same validation, routing, cancellation and metrics.
#ifndef BATON_COORDINATOR_HTTP_OPENAI_GATEWAY_H_
#define BATON_COORDINATOR_HTTP_OPENAI_GATEWAY_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "baton/v1/api.grpc.pb.h"
#include "common/auth/api_keys.h"
#include "coordinator/http/completion_job.h"
#include "coordinator/http/http_server.h"
#include "coordinator/http/in_flight.h"
#include "coordinator/http/openai_response.h"

namespace baton::http {

struct OpenAiGatewayOptions {
  // Listener, body limit, I/O threads.
  HttpServerOptions http;
  // The served model's context length, and the max_tokens of a chat
  // request without one: min(default_max_tokens, context_length -
  // prompt_tokens); 0 = the rest of the context.
  int64_t context_length = 0;
  int64_t default_max_tokens = 1024;
  // Vocabulary entries as bytes, for logprobs' token strings. Required.
  TokenBytesFn token_bytes;
  // Deadline of the unary calls behind /v1/models and /health.
  absl::Duration unary_deadline = absl::Seconds(5);
  // With keys, every path but `open_paths` needs "Authorization: Bearer
  // KEY" (401 otherwise); the channel must then carry the keys' process
  // key (BearerInterceptors). Must outlive the gateway.
  ApiKeys* api_keys = nullptr;
  std::vector<std::string> open_paths = {"/health", "/metrics"};
};

class OpenAiGateway {
 public:
  // Serves HTTP on options.http.listen; `channel` reaches a Baton service
  // (grpc::Server::InProcessChannel of the coordinator's server).
  static absl::StatusOr<std::unique_ptr<OpenAiGateway>> Start(
      const OpenAiGatewayOptions& options,
      std::shared_ptr<grpc::Channel> channel);
  // Shutdown(absl::Seconds(5)).
  ~OpenAiGateway();
  OpenAiGateway(const OpenAiGateway&) = delete;
  OpenAiGateway& operator=(const OpenAiGateway&) = delete;

  // "HOST:PORT" with the bound port.
  const std::string& address() const { return server_->address(); }

  // Stops accepting connections, cancels every in-flight call, waits up to
  // `grace` for them to end and up to 1 s more for their responses to be
  // written, then stops serving HTTP. Idempotent.
  void Shutdown(absl::Duration grace);

 private:
  OpenAiGateway(const OpenAiGatewayOptions& options,
                std::shared_ptr<grpc::Channel> channel);
  void Handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange);
  void HandleModels(const std::string& id,
                    std::shared_ptr<HttpExchange> exchange);
  void HandleHealth(std::shared_ptr<HttpExchange> exchange);
  // POST /reset_prefix_cache (the vLLM admin call): Baton.ResetPrefixCache.
  void HandleResetPrefixCache(std::shared_ptr<HttpExchange> exchange);

  const OpenAiGatewayOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Baton::Stub> stub_;
  InFlight in_flight_;
  JobEnvironment env_;
  const int64_t created_;
  std::unique_ptr<HttpServer> server_;
  bool shut_down_ = false;
};

}  // namespace baton::http

#endif  // BATON_COORDINATOR_HTTP_OPENAI_GATEWAY_H_
