#include "coordinator/http/openai_gateway.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/metrics/metrics.h"
#include "common/tsan/annotations.h"
#include "coordinator/http/openai_error.h"
#include "coordinator/http/openai_request.h"
#include "nlohmann/json.hpp"

namespace baton::http {
namespace {

using Json = nlohmann::json;

constexpr char kJson[] = "application/json";
constexpr char kModelsPrefix[] = "/v1/models/";

template <typename Request, typename Response>
struct UnaryCall {
  grpc::ClientContext context;
  Request request;
  Response response;
};

// "%20" and the like in a path segment (model ids may hold spaces).
std::string PercentDecode(const std::string& in) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    int value = 0;
    if (in[i] == '%' && i + 2 < in.size() &&
        absl::SimpleHexAtoi(in.substr(i + 1, 2), &value)) {
      out.push_back(static_cast<char>(value));
      i += 2;
    } else {
      out.push_back(in[i]);
    }
  }
  return out;
}

void RespondJson(HttpExchange& exchange, int status, const Json& body) {
  exchange.Respond(status, kJson, DumpJson(body));
}

void RespondError(HttpExchange& exchange, const HttpError& error,
                  HttpHeaders headers = {}) {
  exchange.Respond(error.status, kJson, error.body, std::move(headers));
}

}  // namespace

OpenAiGateway::OpenAiGateway(const OpenAiGatewayOptions& options,
                             std::shared_ptr<grpc::Channel> channel)
    : options_(options),
      channel_(std::move(channel)),
      stub_(v1::Baton::NewStub(channel_)),
      created_(absl::ToUnixSeconds(absl::Now())) {
  env_.stub = stub_.get();
  env_.in_flight = &in_flight_;
  env_.context_length = options_.context_length;
  env_.default_max_tokens = options_.default_max_tokens;
  env_.token_bytes = options_.token_bytes;
}

absl::StatusOr<std::unique_ptr<OpenAiGateway>> OpenAiGateway::Start(
    const OpenAiGatewayOptions& options,
    std::shared_ptr<grpc::Channel> channel) {
  if (!options.token_bytes || channel == nullptr) {
    return absl::InvalidArgumentError(
        "OpenAiGateway needs token_bytes and a channel");
  }
  std::unique_ptr<OpenAiGateway> gateway(
      new OpenAiGateway(options, std::move(channel)));
  OpenAiGateway* self = gateway.get();
  auto server = HttpServer::Start(
      options.http,
      [self](HttpRequest request, std::shared_ptr<HttpExchange> exchange) {
        self->Handle(std::move(request), std::move(exchange));
      });
  if (!server.ok()) return server.status();
  gateway->server_ = std::move(*server);
  return gateway;
}

OpenAiGateway::~OpenAiGateway() { Shutdown(absl::Seconds(5)); }

void OpenAiGateway::Shutdown(absl::Duration grace) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  server_->StopAccepting();
  in_flight_.CancelAll();
  const bool idle = in_flight_.WaitIdle(grace);
  // The cancelled calls' last bytes (error events, error responses) go out.
  server_->Stop(absl::Seconds(1));
  if (!idle) {
    // A call that outlives the grace still points at the server's
    // connections: keep them (the process is exiting) rather than free them
    // under it.
    std::fprintf(stderr,
                 "baton-coordinator: %lld HTTP calls still running after "
                 "shutdown grace\n",
                 static_cast<long long>(in_flight_.size()));
    server_.release();
    return;
  }
  server_.reset();
}

void OpenAiGateway::Handle(HttpRequest request,
                           std::shared_ptr<HttpExchange> exchange) {
  const std::string& path = request.path;
  if (options_.api_keys != nullptr &&
      std::find(options_.open_paths.begin(), options_.open_paths.end(), path) ==
          options_.open_paths.end()) {
    if (absl::Status auth = options_.api_keys->Check(request.authorization);
        !auth.ok()) {
      return RespondError(
          *exchange,
          MakeHttpError(401, std::string(auth.message()), "invalid_api_key"),
          {{"WWW-Authenticate", "Bearer"}});
    }
  }
  const bool post = request.method == "POST";
  const bool get = request.method == "GET";
  auto wrong_method = [&](const char* allowed) {
    RespondError(
        *exchange,
        MakeHttpError(405,
                      absl::StrCat(request.method, " is not allowed on ", path,
                                   " (use ", allowed, ")"),
                      "method_not_allowed"),
        {{"Allow", allowed}});
  };
  if (path == "/v1/chat/completions" || path == "/v1/completions") {
    if (!post) return wrong_method("POST");
    const Endpoint endpoint =
        path == "/v1/completions" ? Endpoint::kCompletion : Endpoint::kChat;
    auto parsed = ParseOpenAiRequest(endpoint, request.body);
    if (!parsed.ok())
      return RespondError(*exchange, ToHttpError(parsed.status()));
    return CompletionJob::Start(&env_, std::move(*parsed), std::move(exchange));
  }
  if (path == "/v1/models" || absl::StartsWith(path, kModelsPrefix)) {
    if (!get) return wrong_method("GET");
    const std::string id =
        path == "/v1/models"
            ? std::string()
            : PercentDecode(path.substr(sizeof(kModelsPrefix) - 1));
    return HandleModels(id, std::move(exchange));
  }
  if (path == "/reset_prefix_cache") {
    if (!post) return wrong_method("POST");
    return HandleResetPrefixCache(std::move(exchange));
  }
  if (path == "/health") {
    if (!get) return wrong_method("GET");
    return HandleHealth(std::move(exchange));
  }
  if (path == "/metrics") {
    if (!get) return wrong_method("GET");
    return exchange->Respond(200, "text/plain; version=0.0.4",
                             metrics::TextExposition());
  }
  RespondError(*exchange,
               MakeHttpError(404, absl::StrCat("no route for ", path),
                             "route_not_found"));
}

void OpenAiGateway::HandleModels(const std::string& id,
                                 std::shared_ptr<HttpExchange> exchange) {
  using Call = UnaryCall<v1::ListModelsRequest, v1::ListModelsResponse>;
  auto call = std::make_shared<Call>();
  call->context.set_deadline(
      absl::ToChronoTime(absl::Now() + options_.unary_deadline));
  const uint64_t op = in_flight_.Add([call] { call->context.TryCancel(); });
  BATON_TSAN_RELEASE(call.get());  // see common/tsan/annotations.h
  stub_->async()->ListModels(
      &call->context, &call->request, &call->response,
      [this, call, op, id, exchange](grpc::Status status) mutable {
        BATON_TSAN_ACQUIRE(call.get());
        if (!status.ok()) {
          RespondError(*exchange, ToHttpError(FromGrpc(status)));
        } else {
          Json data = Json::array();
          for (const v1::ModelInfo& m : call->response.models()) {
            Json model = {{"id", m.id()},
                          {"object", "model"},
                          {"created", created_},
                          {"owned_by", "baton"},
                          {"max_model_len", m.context_length()}};
            if (!id.empty() && m.id() == id) {
              RespondJson(*exchange, 200, model);
              data = nullptr;
              break;
            }
            data.push_back(std::move(model));
          }
          if (id.empty()) {
            RespondJson(*exchange, 200, {{"object", "list"}, {"data", data}});
          } else if (!data.is_null()) {
            RespondError(*exchange,
                         ToHttpError(absl::NotFoundError(absl::StrCat(
                             "model '", id, "' is not served here"))));
          }
        }
        exchange.reset();  // before the gateway may be torn down
        in_flight_.Remove(op);
      });
}

void OpenAiGateway::HandleResetPrefixCache(
    std::shared_ptr<HttpExchange> exchange) {
  using Call =
      UnaryCall<v1::ResetPrefixCacheRequest, v1::ResetPrefixCacheResponse>;
  auto call = std::make_shared<Call>();
  call->context.set_deadline(
      absl::ToChronoTime(absl::Now() + options_.unary_deadline));
  const uint64_t op = in_flight_.Add([call] { call->context.TryCancel(); });
  BATON_TSAN_RELEASE(call.get());
  stub_->async()->ResetPrefixCache(
      &call->context, &call->request, &call->response,
      [this, call, op, exchange](grpc::Status status) mutable {
        BATON_TSAN_ACQUIRE(call.get());
        if (!status.ok()) {
          RespondError(*exchange, ToHttpError(FromGrpc(status)));
        } else {
          const v1::ResetPrefixCacheResponse& r = call->response;
          Json failed = Json::array();
          for (const std::string& f : r.failed_workers()) failed.push_back(f);
          // 200 when every worker reset; 503 naming the ones that did not.
          RespondJson(*exchange, failed.empty() ? 200 : 503,
                      {{"workers_reset", r.workers_reset()},
                       {"blocks_dropped", r.blocks_dropped()},
                       {"failed_workers", failed}});
        }
        exchange.reset();
        in_flight_.Remove(op);
      });
}

void OpenAiGateway::HandleHealth(std::shared_ptr<HttpExchange> exchange) {
  using Call =
      UnaryCall<v1::GetClusterStatusRequest, v1::GetClusterStatusResponse>;
  auto call = std::make_shared<Call>();
  call->context.set_deadline(
      absl::ToChronoTime(absl::Now() + options_.unary_deadline));
  const uint64_t op = in_flight_.Add([call] { call->context.TryCancel(); });
  BATON_TSAN_RELEASE(call.get());
  stub_->async()->GetClusterStatus(
      &call->context, &call->request, &call->response,
      [this, call, op, exchange](grpc::Status status) mutable {
        BATON_TSAN_ACQUIRE(call.get());
        int prefill = 0, decode = 0, both = 0;
        for (const v1::WorkerStatus& w : call->response.workers()) {
          if (w.health() != v1::WORKER_HEALTH_HEALTHY) continue;
          if (w.role() == v1::WORKER_ROLE_PREFILL) ++prefill;
          if (w.role() == v1::WORKER_ROLE_DECODE) ++decode;
          if (w.role() == v1::WORKER_ROLE_BOTH) ++both;
        }
        const bool ok =
            status.ok() && (both > 0 || (prefill > 0 && decode > 0));
        Json body = {
            {"status", ok ? "ok" : "unavailable"},
            {"healthy_workers",
             {{"prefill", prefill}, {"decode", decode}, {"both", both}}}};
        body["active_requests"] = call->response.active_requests();
        if (!status.ok()) body["error"] = status.error_message();
        RespondJson(*exchange, ok ? 200 : 503, body);
        exchange.reset();
        in_flight_.Remove(op);
      });
}

}  // namespace baton::http
