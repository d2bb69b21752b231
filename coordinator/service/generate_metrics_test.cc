// One Generate request through an in-process cluster (coordinator services
// and workers on loopback gRPC, KV over TCP) moves the coordinator's and the
// workers' metrics by exactly what the request did: one request, one TTFT
// observation, the result's token counts, and the handoff's bytes on both
// sides of the transfer.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "baton/v1/api.grpc.pb.h"
#include "baton/v1/worker.grpc.pb.h"
#include "common/grpc/serving.h"
#include "common/metrics/exposition_parser.h"
#include "common/metrics/http_get.h"
#include "common/metrics/metrics.h"
#include "common/metrics/metrics_server.h"
#include "common/test_util.h"
#include "coordinator/service/cluster.h"
#include "coordinator/service/coordinator_services.h"
#include "coordinator/service/test_cluster.h"
#include "gtest/gtest.h"
#include "worker/engine/default_model_test_base.h"
#include "worker/engine/engine.h"
#include "worker/service/proto_convert.h"
#include "worker/service/worker_service.h"

namespace baton::coordinator {
namespace {

using metrics::LabelSet;
using metrics::Sample;

constexpr int kMaxTokens = 6;

std::unique_ptr<grpc::ClientContext> Context() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(60));
  return context;
}

// A worker: engine, service and gRPC server on 127.0.0.1:0.
struct InProcessWorker {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<WorkerService> service;
  std::unique_ptr<grpc::Server> server;
  std::string address;

  ~InProcessWorker() {
    if (server != nullptr) {
      server->Shutdown(std::chrono::system_clock::now() +
                       std::chrono::seconds(1));
    }
    service.reset();
    engine.reset();
  }
};

// The coordinator's services over a Cluster, on 127.0.0.1:0.
struct InProcessCoordinator {
  std::unique_ptr<Cluster> cluster;
  std::unique_ptr<ControlPlaneService> control_plane;
  std::unique_ptr<BatonService> api;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1::Baton::Stub> baton;
  std::unique_ptr<v1::Coordinator::Stub> control;

  ~InProcessCoordinator() {
    if (cluster != nullptr) cluster->Shutdown();
    if (server != nullptr) {
      server->Shutdown(std::chrono::system_clock::now() +
                       std::chrono::seconds(1));
    }
    server.reset();
    cluster.reset();
  }
};

// Every sample of the process-wide registry right now.
std::vector<Sample> Scrape() {
  auto samples = metrics::ParseExposition(metrics::TextExposition());
  EXPECT_TRUE(samples.ok()) << samples.status();
  return samples.ok() ? *samples : std::vector<Sample>();
}

// The value of a sample (0 if it is not there yet: a series appears on its
// first event).
double ValueOf(const std::vector<Sample>& samples, const std::string& name,
               const LabelSet& labels) {
  auto value = metrics::FindSample(samples, name, labels);
  if (value.status().code() == absl::StatusCode::kNotFound) return 0;
  EXPECT_TRUE(value.ok()) << value.status();
  return value.ok() ? *value : -1;
}

class CoordinatorGenerateMetricsTest : public testing::DefaultModelTest {
 protected:
  void StartCoordinator() {
    // No heartbeats in this test: workers stay healthy for its length.
    auto cluster = ClusterWithoutHeartbeats();
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    coordinator_.cluster = std::move(*cluster);
    coordinator_.control_plane =
        std::make_unique<ControlPlaneService>(coordinator_.cluster.get());
    coordinator_.api =
        std::make_unique<BatonService>(coordinator_.cluster.get());
    // One server for both planes: this test needs no separation.
    auto running =
        StartServer("127.0.0.1:0",
                    {{coordinator_.control_plane.get(),
                      v1::Coordinator::service_full_name()},
                     {coordinator_.api.get(), v1::Baton::service_full_name()}});
    ASSERT_TRUE(running.ok()) << running.status();
    coordinator_.server = std::move(running->server);
    auto channel = grpc::CreateChannel(running->address,
                                       grpc::InsecureChannelCredentials());
    coordinator_.baton = v1::Baton::NewStub(channel);
    coordinator_.control = v1::Coordinator::NewStub(channel);
  }

  // Starts a worker of `role` and registers it with the coordinator.
  void StartWorker(v1::WorkerRole role) {
    auto worker = std::make_unique<InProcessWorker>();
    EngineOptions engine_options;
    engine_options.num_threads = 1;
    engine_options.kv_cache_blocks = 64;
    auto engine = Engine::Create(engine_options, weights_, tokenizer_);
    ASSERT_TRUE(engine.ok()) << engine.status();
    worker->engine = std::move(*engine);
    WorkerServiceOptions options;
    options.role = role;
    options.model_id = coordinator_.cluster->model().id();
    auto service = WorkerService::Create(options, worker->engine.get());
    ASSERT_TRUE(service.ok()) << service.status();
    worker->service = std::move(*service);
    auto running =
        StartServer("127.0.0.1:0",
                    {{worker->service.get(), v1::Worker::service_full_name()}});
    ASSERT_TRUE(running.ok()) << running.status();
    worker->server = std::move(running->server);
    worker->address = running->address;

    v1::RegisterWorkerRequest request;
    request.set_role(role);
    request.set_address(worker->address);
    request.set_model_id(options.model_id);
    *request.mutable_kv_layout() = ToProto(worker->engine->kv_cache().layout());
    request.set_kv_blocks_total(worker->engine->stats().kv_blocks_total);
    request.add_kv_transports(v1::KV_TRANSPORT_HOST_TCP);
    request.set_context_length(
        static_cast<int32_t>(worker->engine->config().context_length));
    request.set_vocab_size(
        static_cast<int32_t>(worker->engine->config().vocab_size));
    v1::RegisterWorkerResponse response;
    auto context = Context();
    const grpc::Status status =
        coordinator_.control->RegisterWorker(context.get(), request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    worker->service->SetWorkerRef(response.worker_id(), worker->address);
    workers_.push_back(std::move(worker));
  }

  // One greedy request of kMaxTokens tokens (ignore_eos); its result.
  v1::GenerateResult Generate() {
    v1::GenerateRequest request;
    request.set_text("The three primary colors are");
    request.mutable_sampling()->set_temperature(0.0);
    request.mutable_sampling()->set_max_tokens(kMaxTokens);
    request.mutable_sampling()->set_ignore_eos(true);
    auto context = Context();
    auto reader = coordinator_.baton->Generate(context.get(), request);
    v1::GenerateResponse response;
    v1::GenerateResult result;
    int tokens = 0;
    while (reader->Read(&response)) {
      tokens += response.token_ids_size();
      if (response.has_result()) result = response.result();
    }
    const grpc::Status status = reader->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(result.finish_reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(tokens, kMaxTokens);
    EXPECT_EQ(result.usage().completion_tokens(), kMaxTokens);
    return result;
  }

  // Checks the coordinator's metrics moved by one finished request.
  static void ExpectOneCoordinatorRequest(const std::vector<Sample>& before,
                                          const std::vector<Sample>& after,
                                          const v1::GenerateResult& result) {
    auto delta = [&](const std::string& name, LabelSet labels = {}) {
      labels["role"] = "coordinator";
      return ValueOf(after, name, labels) - ValueOf(before, name, labels);
    };
    EXPECT_EQ(delta("baton_requests_total", {{"status", "length"}}), 1);
    EXPECT_EQ(delta("baton_requests_total", {{"status", "stop"}}), 0);
    EXPECT_EQ(delta("baton_time_to_first_token_seconds_count"), 1);
    EXPECT_GT(delta("baton_time_to_first_token_seconds_sum"), 0);
    EXPECT_EQ(delta("baton_e2e_request_latency_seconds_count"), 1);
    EXPECT_EQ(delta("baton_request_queue_time_seconds_count"), 1);
    EXPECT_EQ(delta("baton_time_per_output_token_seconds_count"), 1);
    EXPECT_EQ(delta("baton_inter_token_latency_seconds_count"), kMaxTokens - 1);
    EXPECT_EQ(delta("baton_prompt_tokens_total"),
              result.usage().prompt_tokens());
    EXPECT_EQ(delta("baton_generation_tokens_total"), kMaxTokens);
    EXPECT_EQ(
        ValueOf(after, "baton_requests_active", {{"role", "coordinator"}}), 0);
  }

  InProcessCoordinator coordinator_;
  std::vector<std::unique_ptr<InProcessWorker>> workers_;
};

TEST_F(CoordinatorGenerateMetricsTest, SplitRequestMovesEveryCounterOnce) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  ASSERT_NO_FATAL_FAILURE(StartWorker(v1::WORKER_ROLE_PREFILL));
  ASSERT_NO_FATAL_FAILURE(StartWorker(v1::WORKER_ROLE_DECODE));
  const std::vector<Sample> before = Scrape();
  const v1::GenerateResult result = Generate();
  const std::vector<Sample> after = Scrape();
  ASSERT_EQ(result.kv_transport(), v1::KV_TRANSPORT_HOST_TCP);
  ExpectOneCoordinatorRequest(before, after, result);

  auto delta = [&](const std::string& role, const std::string& name,
                   LabelSet labels = {}) {
    labels["role"] = role;
    return ValueOf(after, name, labels) - ValueOf(before, name, labels);
  };
  const int64_t prompt = result.usage().prompt_tokens();
  EXPECT_EQ(delta("prefill", "baton_worker_prefill_tokens_total"), prompt);
  EXPECT_EQ(delta("prefill", "baton_worker_decode_tokens_total"), 0);
  EXPECT_EQ(delta("decode", "baton_worker_prefill_tokens_total"), 0);
  // The first token came with the prefill.
  EXPECT_EQ(delta("decode", "baton_worker_decode_tokens_total"),
            kMaxTokens - 1);
  EXPECT_EQ(delta("prefill", "baton_worker_requests_total",
                  {{"phase", "prefill"}, {"status", "ok"}}),
            1);
  EXPECT_EQ(delta("decode", "baton_worker_requests_total",
                  {{"phase", "decode"}, {"status", "length"}}),
            1);
  const int64_t kv_bytes = result.timings().kv_transfer_bytes();
  ASSERT_GT(kv_bytes, 0);
  EXPECT_EQ(delta("prefill", "baton_worker_kv_transfer_bytes_total",
                  {{"direction", "sent"}}),
            kv_bytes);
  EXPECT_EQ(delta("decode", "baton_worker_kv_transfer_bytes_total",
                  {{"direction", "received"}}),
            kv_bytes);
  EXPECT_EQ(delta("prefill", "baton_worker_kv_transfer_seconds_count",
                  {{"direction", "sent"}}),
            1);
  EXPECT_EQ(delta("decode", "baton_worker_kv_transfer_seconds_count",
                  {{"direction", "received"}}),
            1);
  // Gauges are refreshed at the scrape: everything is free again, nothing
  // queued.
  EXPECT_EQ(ValueOf(after, "baton_worker_queued_prefill_tokens",
                    {{"role", "prefill"}}),
            0);
  EXPECT_EQ(ValueOf(after, "baton_worker_kv_blocks_free", {{"role", "decode"}}),
            64);
  EXPECT_EQ(ValueOf(after, "baton_workers_healthy",
                    {{"role", "coordinator"}, {"worker_role", "prefill"}}),
            1);
  EXPECT_EQ(ValueOf(after, "baton_workers_healthy",
                    {{"role", "coordinator"}, {"worker_role", "decode"}}),
            1);
}

TEST_F(CoordinatorGenerateMetricsTest, ColocatedRequestAndRejectedRequest) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  ASSERT_NO_FATAL_FAILURE(StartWorker(v1::WORKER_ROLE_BOTH));
  const std::vector<Sample> before = Scrape();
  const v1::GenerateResult result = Generate();
  // Refused before it runs: counted by its code, no latency observed.
  {
    v1::GenerateRequest bad;
    bad.set_model("not-served");
    bad.set_text("hi");
    auto context = Context();
    auto reader = coordinator_.baton->Generate(context.get(), bad);
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
  const std::vector<Sample> after = Scrape();
  ASSERT_EQ(result.kv_transport(), v1::KV_TRANSPORT_LOCAL);
  ExpectOneCoordinatorRequest(before, after, result);
  auto delta = [&](const std::string& name, LabelSet labels) {
    return ValueOf(after, name, labels) - ValueOf(before, name, labels);
  };
  EXPECT_EQ(delta("baton_requests_total",
                  {{"role", "coordinator"}, {"status", "not_found"}}),
            1);
  EXPECT_EQ(delta("baton_worker_prefill_tokens_total", {{"role", "both"}}),
            result.usage().prompt_tokens());
  EXPECT_EQ(delta("baton_worker_decode_tokens_total", {{"role", "both"}}),
            kMaxTokens - 1);
  EXPECT_EQ(
      delta("baton_worker_requests_total",
            {{"role", "both"}, {"phase", "decode"}, {"status", "length"}}),
      1);
  EXPECT_EQ(delta("baton_worker_kv_transfer_bytes_total",
                  {{"role", "both"}, {"direction", "sent"}}),
            0);

  // The same numbers over HTTP from a metrics listener.
  auto server = metrics::StartMetricsServer("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  auto body = metrics::HttpGet((*server)->address(), "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  auto served = metrics::ParseExposition(*body);
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ(
      ValueOf(*served, "baton_worker_decode_tokens_total", {{"role", "both"}}),
      ValueOf(after, "baton_worker_decode_tokens_total", {{"role", "both"}}));
  EXPECT_EQ(ValueOf(*served, "baton_workers_healthy",
                    {{"role", "coordinator"}, {"worker_role", "both"}}),
            1);
}

}  // namespace
}  // namespace baton::coordinator
