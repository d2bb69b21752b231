// The remote generate tests' harness: FakeServer, a Baton service on
// 127.0.0.1 whose Generate runs a given handler and records every request,
// canned responses, and parsing of the client's JSON lines.
#ifndef BATON_CLI_REMOTE_GENERATE_TEST_HARNESS_H_
#define BATON_CLI_REMOTE_GENERATE_TEST_HARNESS_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "baton/v1/api.grpc.pb.h"
#include "cli/remote_generate.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace baton::cli::remote_generate_test {

using Json = nlohmann::json;

using GenerateHandler =
    std::function<grpc::Status(grpc::ServerContext*, const v1::GenerateRequest&,
                               grpc::ServerWriter<v1::GenerateResponse>*)>;

// A Baton service whose Generate runs `handler` and records every request.
class FakeBaton final : public v1::Baton::Service {
 public:
  explicit FakeBaton(GenerateHandler handler) : handler_(std::move(handler)) {}

  grpc::Status Generate(
      grpc::ServerContext* context, const v1::GenerateRequest* request,
      grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(*request);
    }
    return handler_(context, *request, writer);
  }

  std::vector<v1::GenerateRequest> requests() const {
    absl::MutexLock lock(&mu_);
    return requests_;
  }

 private:
  GenerateHandler handler_;
  mutable absl::Mutex mu_;
  std::vector<v1::GenerateRequest> requests_ ABSL_GUARDED_BY(mu_);
};

// The fake on 127.0.0.1 with a kernel-chosen port.
class FakeServer {
 public:
  explicit FakeServer(GenerateHandler handler) : service_(std::move(handler)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~FakeServer() { server_->Shutdown(); }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::vector<v1::GenerateRequest> requests() const {
    return service_.requests();
  }

 private:
  FakeBaton service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

inline v1::GenerateResult StopResult() {
  v1::GenerateResult result;
  result.set_finish_reason(v1::FINISH_REASON_STOP);
  result.mutable_usage()->set_prompt_tokens(9);
  result.mutable_usage()->set_completion_tokens(2);
  v1::PhaseTimings* t = result.mutable_timings();
  t->set_queue_ms(1.5);
  t->set_prefill_ms(8.25);
  t->set_kv_transfer_bytes(4096);
  t->set_kv_transfer_ms(3.0);
  t->set_kv_transfer_exposed_ms(0.75);
  t->set_ttft_ms(12.5);
  t->set_decode_tokens_per_s(40.0);
  t->set_total_ms(37.5);
  result.mutable_prefill_worker()->set_worker_id("p-1");
  result.mutable_prefill_worker()->set_address("10.0.0.1:7001");
  result.mutable_decode_worker()->set_worker_id("d-1");
  result.mutable_decode_worker()->set_address("10.0.0.2:7002");
  result.set_kv_transport(v1::KV_TRANSPORT_HOST_TCP);
  result.set_seed(42);
  result.set_stop_string("END");
  return result;
}

// Two messages: "Hi" (token 10) then " there" (token 11) with StopResult.
// Logprobs are attached when the request asked for them.
inline grpc::Status TwoTokens(
    grpc::ServerContext*, const v1::GenerateRequest& req,
    grpc::ServerWriter<v1::GenerateResponse>* writer) {
  const bool reports =
      req.sampling().has_logprobs() || req.sampling().show_probs() > 0;
  v1::GenerateResponse first;
  first.set_request_id("r-1");
  first.add_token_ids(10);
  first.set_text("Hi");
  if (reports) {
    v1::TokenLogprobs* lp = first.add_logprobs();
    lp->set_token_id(10);
    lp->set_logprob(-0.5f);
    v1::TokenLogprob* alt = lp->add_top_logprobs();
    alt->set_token_id(10);
    alt->set_logprob(-0.5f);
    v1::TokenProb* p = lp->add_processed();
    p->set_token_id(10);
    p->set_prob(0.75f);
  }
  writer->Write(first);
  v1::GenerateResponse last;
  last.set_request_id("r-1");
  last.add_token_ids(11);
  last.set_text(" there");
  if (reports) {
    v1::TokenLogprobs* lp = last.add_logprobs();
    lp->set_token_id(11);
    lp->set_logprob(-1.25f);
  }
  *last.mutable_result() = StopResult();
  writer->Write(last);
  return grpc::Status::OK;
}

inline RemoteGenerateOptions Options(const FakeServer& server) {
  RemoteGenerateOptions o;
  o.server = server.address();
  o.deadline_ms = 10000;
  o.generate.prompt = "Hello";
  o.generate.sampling.temperature = 0.0;
  o.generate.sampling.max_tokens = 8;
  return o;
}

inline std::vector<Json> ParseLines(const std::string& text) {
  std::vector<Json> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(j.is_discarded()) << line;
    lines.push_back(j);
  }
  return lines;
}

}  // namespace baton::cli::remote_generate_test

#endif  // BATON_CLI_REMOTE_GENERATE_TEST_HARNESS_H_
