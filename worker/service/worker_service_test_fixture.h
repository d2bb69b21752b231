// The WorkerService tests' fixture: workers on loopback gRPC around engines
// on the default model, and the in-process engine they are compared with.
#ifndef BATON_WORKER_SERVICE_WORKER_SERVICE_TEST_FIXTURE_H_
#define BATON_WORKER_SERVICE_WORKER_SERVICE_TEST_FIXTURE_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "baton/v1/worker.grpc.pb.h"
#include "common/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/default_model_test_base.h"
#include "worker/engine/engine.h"
#include "worker/service/worker_service.h"

namespace baton::worker_service_test {

inline constexpr uint64_t kSeed = 1234;
inline constexpr int kMaxTokens = 8;

struct Generated {
  std::vector<int32_t> tokens;
  std::string text;
};

std::unique_ptr<grpc::ClientContext> Context() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(60));
  return context;
}

// One worker: engine, service and gRPC server on 127.0.0.1:0.
struct TestWorker {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<WorkerService> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1::Worker::Stub> stub;
  std::string address;  // of the gRPC server

  ~TestWorker() {
    if (server != nullptr) {
      server->Shutdown(std::chrono::system_clock::now() +
                       std::chrono::seconds(1));
    }
    service.reset();
    engine.reset();
  }

  v1::WorkerLoad Load() {
    v1::GetWorkerStatusResponse response;
    auto context = Context();
    const grpc::Status status = stub->GetWorkerStatus(
        context.get(), v1::GetWorkerStatusRequest(), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.load();
  }

  // Polls (bounded) until every block is free; returns the last load.
  // Blocks and the lease list are released on the engine and transport
  // threads after the client's stream ends, so wait (up to 5 s) for both.
  v1::WorkerLoad WaitAllFree() {
    v1::WorkerLoad load;
    for (int i = 0; i < 500; ++i) {
      load = Load();
      if (load.kv_blocks_free() == load.kv_blocks_total() &&
          service->LeasedRequestIds().empty()) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return load;
  }
};

class WorkerServiceTest : public testing::DefaultModelTest {
 protected:
  static std::unique_ptr<Engine> MakeEngine(
      ForwardRunnerFactory make_runner = nullptr) {
    EngineOptions options;
    options.num_threads = 1;
    options.kv_cache_blocks = 64;
    options.make_runner = std::move(make_runner);
    auto engine = Engine::Create(options, weights_, tokenizer_);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? std::move(*engine) : nullptr;
  }

  // `configure` may set more options once the engine exists.
  static std::unique_ptr<TestWorker> StartWorker(
      v1::WorkerRole role, ForwardRunnerFactory make_runner = nullptr,
      const std::function<void(Engine&, WorkerServiceOptions&)>& configure =
          nullptr) {
    auto worker = std::make_unique<TestWorker>();
    worker->engine = MakeEngine(std::move(make_runner));
    if (worker->engine == nullptr) return nullptr;
    WorkerServiceOptions options;
    options.role = role;
    options.model_id = "smollm2";
    if (configure) configure(*worker->engine, options);
    auto service = WorkerService::Create(options, worker->engine.get());
    EXPECT_TRUE(service.ok()) << service.status();
    if (!service.ok()) return nullptr;
    worker->service = std::move(*service);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(worker->service.get());
    worker->server = builder.BuildAndStart();
    EXPECT_NE(worker->server, nullptr);
    EXPECT_GT(port, 0);
    worker->address = "127.0.0.1:" + std::to_string(port);
    worker->service->SetWorkerRef("", worker->address);
    worker->stub = v1::Worker::NewStub(grpc::CreateChannel(
        worker->address, grpc::InsecureChannelCredentials()));
    return worker;
  }

  static std::vector<int32_t> Prompt(const std::string& user) {
    return tokenizer_->Encode("<|im_start|>user\n" + user +
                              "<|im_end|>\n<|im_start|>assistant\n");
  }

  static v1::SamplingParams Greedy(int max_tokens = kMaxTokens) {
    v1::SamplingParams sampling;
    sampling.set_temperature(0.0);
    sampling.set_seed(kSeed);
    sampling.set_max_tokens(max_tokens);
    sampling.set_ignore_eos(true);
    return sampling;
  }

  // The same request on one in-process engine.
  static Generated Reference(const std::vector<int32_t>& prompt) {
    std::unique_ptr<Engine> engine = MakeEngine();
    GenerationRequest request;
    request.id = "reference";
    request.prompt = prompt;
    request.params.temperature = 0.0;
    request.params.seed = kSeed;
    request.params.max_tokens = kMaxTokens;
    request.params.ignore_eos = true;
    Generated out;
    EXPECT_TRUE(engine
                    ->Submit(request,
                             [&out](const RequestOutput& o) {
                               for (const TokenOutput& t : o.tokens) {
                                 out.tokens.push_back(t.token);
                               }
                               out.text += o.text;
                             })
                    .ok());
    engine->RunUntilIdle();
    return out;
  }

  // Reads a Prefill stream: the first token, and whether a handoff came.
  static grpc::Status RunPrefill(TestWorker& worker,
                                 const v1::PrefillRequest& request,
                                 int32_t* first, bool* handoff,
                                 v1::PrefillHandoff* report = nullptr) {
    auto context = Context();
    auto reader = worker.stub->Prefill(context.get(), request);
    v1::PrefillResponse response;
    *handoff = false;
    while (reader->Read(&response)) {
      if (response.has_first_token())
        *first = response.first_token().token_id();
      if (response.has_handoff()) {
        *handoff = true;
        if (report != nullptr) *report = response.handoff();
      }
    }
    return reader->Finish();
  }

  // ReserveKv on `decode`, Prefill on `prefill` with every endpoint the
  // reservation offered, Decode on `decode`; the whole token stream.
  static std::vector<int32_t> Split(
      TestWorker& prefill, TestWorker& decode, const std::string& id,
      const std::vector<int32_t>& prompt, v1::ReserveKvResponse* reserved,
      v1::KvTransport* transport = nullptr,
      v1::PrefillHandoff* handoff_report = nullptr) {
    v1::ReserveKvRequest reserve;
    reserve.set_request_id(id);
    reserve.set_model_id("smollm2");
    reserve.set_num_prompt_tokens(static_cast<int32_t>(prompt.size()));
    reserve.set_max_tokens(kMaxTokens);
    auto context = Context();
    const grpc::Status status =
        decode.stub->ReserveKv(context.get(), reserve, reserved);
    EXPECT_TRUE(status.ok()) << status.error_message();
    v1::PrefillRequest request;
    request.set_request_id(id);
    request.set_model_id("smollm2");
    request.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
    *request.mutable_sampling() = Greedy();
    *request.mutable_kv_target()->mutable_endpoint() = reserved->endpoint();
    *request.mutable_kv_target()->mutable_alternatives() =
        reserved->alternatives();
    request.mutable_kv_target()->set_transfer_id(reserved->transfer_id());
    request.mutable_kv_target()->set_transfer_secret(
        reserved->transfer_secret());
    int32_t first = -1;
    bool handoff = false;
    v1::PrefillHandoff report;
    const grpc::Status prefilled =
        RunPrefill(prefill, request, &first, &handoff, &report);
    if (transport != nullptr) *transport = report.kv_transport();
    if (handoff_report != nullptr) *handoff_report = report;
    EXPECT_TRUE(prefilled.ok()) << prefilled.error_message();
    EXPECT_TRUE(handoff);
    return DecodeAfter(decode, id, prompt, *reserved, first);
  }

  // Decode on `decode` of the reservation after the prefill's first token;
  // the whole token stream.
  static std::vector<int32_t> DecodeAfter(TestWorker& decode,
                                          const std::string& id,
                                          const std::vector<int32_t>& prompt,
                                          const v1::ReserveKvResponse& reserved,
                                          int32_t first) {
    v1::DecodeRequest decode_request;
    decode_request.set_request_id(id);
    decode_request.set_transfer_id(reserved.transfer_id());
    decode_request.mutable_prompt_token_ids()->Add(prompt.begin(),
                                                   prompt.end());
    *decode_request.mutable_sampling() = Greedy();
    decode_request.add_generated_token_ids(first);
    Generated rest;
    v1::DecodeResult result;
    const grpc::Status decoded =
        RunDecode(decode, decode_request, &rest, &result);
    EXPECT_TRUE(decoded.ok()) << decoded.error_message();
    std::vector<int32_t> tokens = {first};
    tokens.insert(tokens.end(), rest.tokens.begin(), rest.tokens.end());
    return tokens;
  }

  static grpc::Status RunDecode(TestWorker& worker,
                                const v1::DecodeRequest& request,
                                Generated* out, v1::DecodeResult* result) {
    auto context = Context();
    auto reader = worker.stub->Decode(context.get(), request);
    v1::DecodeResponse response;
    while (reader->Read(&response)) {
      for (int32_t t : response.token_ids()) out->tokens.push_back(t);
      out->text += response.text();
      if (response.has_result()) *result = response.result();
    }
    return reader->Finish();
  }
};

}  // namespace baton::worker_service_test

#endif  // BATON_WORKER_SERVICE_WORKER_SERVICE_TEST_FIXTURE_H_
