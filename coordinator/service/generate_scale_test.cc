// Thousands of concurrent Generate streams cost the coordinator a few
// threads, not one each: its calls are coroutines on a small executor and
// its worker RPCs use gRPC's callback API. Two minimal fake workers (a
// prefill one that answers at once, a decode one that holds every stream
// until the test lets them all go) and a client of callback reactors keep
// 5,000 requests in flight inside one process; the test counts the
// process's threads then, and every request still ends with its result.
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_callback.h>
#include <grpcpp/support/server_callback.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "baton/v1/api.grpc.pb.h"
#include "baton/v1/worker.grpc.pb.h"
#include "common/grpc/serving.h"
#include "common/test_util.h"
#include "coordinator/service/cluster.h"
#include "coordinator/service/coordinator_services.h"
#include "gtest/gtest.h"

namespace baton::coordinator {
namespace {

constexpr int kStreams = 5000;
// The threads the whole test process may hold with every stream in flight:
// gRPC's pools for four servers' and clients' completion queues, the
// coordinator's executor and sweeper, and the test's own.
constexpr int kMaxThreads = 64;

int ProcessThreads() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

// Decode streams held open until Release (or the coordinator cancels). The
// fake worker owns them until it is destroyed (after its server): OnDone
// frees nothing.
class HeldDecode final : public grpc::ServerWriteReactor<v1::DecodeResponse> {
 public:
  void Release() {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    response_.add_token_ids(28);
    response_.set_text("x");
    response_.mutable_result()->set_finish_reason(v1::FINISH_REASON_LENGTH);
    StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
  }
  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }
  void OnDone() override {}

 private:
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  v1::DecodeResponse response_;
};

// The Worker service of both fake workers: ReserveKv and Cancel succeed,
// Prefill streams its first token and ends, Decode is held.
class FakeWorker final : public v1::Worker::CallbackService {
 public:
  grpc::ServerUnaryReactor* ReserveKv(
      grpc::CallbackServerContext* context, const v1::ReserveKvRequest* request,
      v1::ReserveKvResponse* response) override {
    response->set_transfer_id(request->request_id());
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* context,
                                   const v1::CancelRequest*,
                                   v1::CancelResponse*) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerWriteReactor<v1::PrefillResponse>* Prefill(
      grpc::CallbackServerContext*, const v1::PrefillRequest*) override {
    class FirstToken final
        : public grpc::ServerWriteReactor<v1::PrefillResponse> {
     public:
      FirstToken() {
        response_.mutable_first_token()->set_token_id(28);
        StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
      }
      void OnDone() override { delete this; }

     private:
      v1::PrefillResponse response_;
    };
    return new FirstToken();
  }
  grpc::ServerWriteReactor<v1::DecodeResponse>* Decode(
      grpc::CallbackServerContext*, const v1::DecodeRequest*) override {
    absl::MutexLock lock(&mu_);
    held_.push_back(std::make_unique<HeldDecode>());
    return held_.back().get();
  }

  int held() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(held_.size());
  }
  // Ends every held stream that has not ended (each ends once: Release or
  // OnCancel).
  void ReleaseAll() {
    absl::MutexLock lock(&mu_);
    for (const auto& h : held_) h->Release();
  }

 private:
  absl::Mutex mu_;
  std::vector<std::unique_ptr<HeldDecode>> held_ ABSL_GUARDED_BY(mu_);
};

// One client stream: counts what arrives, records how it ended.
class ClientStream final
    : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  explicit ClientStream(v1::Baton::Stub* stub) {
    request_.set_text("Hello");
    request_.mutable_sampling()->set_max_tokens(2);
    request_.mutable_sampling()->set_temperature(0);
    context_.set_deadline(std::chrono::system_clock::now() +
                          std::chrono::minutes(10));
    stub->async()->Generate(&context_, &request_, this);
    StartRead(&response_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    {
      absl::MutexLock lock(&mu_);
      messages_ += 1;
      if (response_.has_result()) {
        finish_reason_ = response_.result().finish_reason();
      }
    }
    StartRead(&response_);
  }
  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    done_ = true;
  }
  int messages() {
    absl::MutexLock lock(&mu_);
    return messages_;
  }
  bool done() {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  std::string Outcome() {
    absl::MutexLock lock(&mu_);
    if (!status_.ok()) {
      return absl::StrCat("status ", status_.error_code(), " ",
                          status_.error_message());
    }
    return v1::FinishReason_Name(finish_reason_);
  }

 private:
  grpc::ClientContext context_;
  v1::GenerateRequest request_;
  v1::GenerateResponse response_;
  absl::Mutex mu_;
  int messages_ ABSL_GUARDED_BY(mu_) = 0;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  v1::FinishReason finish_reason_ ABSL_GUARDED_BY(mu_) =
      v1::FINISH_REASON_UNSPECIFIED;
};

// Polls `done` every 10 ms; false after `guard` (a hang guard only).
template <typename F>
bool Eventually(F done, absl::Duration guard = absl::Minutes(5)) {
  const absl::Time deadline = absl::Now() + guard;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

TEST(GenerateScaleTest, FiveThousandStreamsCostAFewThreads) {
  auto model = ServedModel::Load(testing::DefaultModelPath());
  ASSERT_TRUE(model.ok()) << model.status();
  ClusterOptions options;
  // No heartbeats: the fake workers stay healthy for the test's length.
  options.registry.heartbeat_interval = absl::Seconds(300);
  options.registry.suspect_after = absl::Seconds(600);
  options.registry.lease_ttl = absl::Seconds(1200);
  options.admission.max_waiting_requests = 2 * kStreams;
  // Slowness is not what this test is about (a sanitizer build on a busy
  // host reaches 5,000 streams in minutes): no queue or transfer timeout.
  options.queue_timeout = absl::Hours(1);
  options.transfer_timeout = absl::Hours(1);
  auto cluster = Cluster::Create(options, std::move(*model), RealClock());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ControlPlaneService control_plane(cluster->get());
  BatonService api(cluster->get());
  auto coordinator = StartServer(
      "127.0.0.1:0", {{&control_plane, v1::Coordinator::service_full_name()},
                      {&api, v1::Baton::service_full_name()}});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  auto channel = grpc::CreateChannel(coordinator->address,
                                     grpc::InsecureChannelCredentials());
  auto baton = v1::Baton::NewStub(channel);
  auto control = v1::Coordinator::NewStub(channel);

  FakeWorker prefill_service;
  FakeWorker decode_service;
  std::vector<RunningServer> workers;
  for (auto [service, role] :
       {std::pair{&prefill_service, v1::WORKER_ROLE_PREFILL},
        std::pair{&decode_service, v1::WORKER_ROLE_DECODE}}) {
    auto running = StartServer("127.0.0.1:0",
                               {{service, v1::Worker::service_full_name()}});
    ASSERT_TRUE(running.ok()) << running.status();
    v1::RegisterWorkerRequest request;
    request.set_role(role);
    request.set_address(running->address);
    request.set_model_id((*cluster)->model().id());
    v1::KvLayout* layout = request.mutable_kv_layout();
    layout->set_num_layers(30);
    layout->set_num_kv_heads(3);
    layout->set_head_dim(64);
    layout->set_block_size(16);
    layout->set_dtype(v1::KV_DTYPE_F16);
    request.set_kv_blocks_total(int64_t{1} << 24);
    request.add_kv_transports(v1::KV_TRANSPORT_HOST_TCP);
    request.set_context_length(8192);
    request.set_vocab_size(49152);
    grpc::ClientContext context;
    v1::RegisterWorkerResponse response;
    const grpc::Status status =
        control->RegisterWorker(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    workers.push_back(std::move(*running));
  }

  const int threads_before = ProcessThreads();
  std::vector<std::unique_ptr<ClientStream>> streams;
  streams.reserve(kStreams);
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(std::make_unique<ClientStream>(baton.get()));
  }
  // Every request holds its first token and waits in its Decode stream.
  EXPECT_TRUE(Eventually([&] { return decode_service.held() == kStreams; }))
      << decode_service.held() << " of " << kStreams << " reached Decode";
  const int threads_in_flight = ProcessThreads();
  const int calls = (*cluster)->active_calls();
  std::printf(
      "%d streams in flight (%d coordinator calls): %d threads in the process "
      "(%d before the first request)\n",
      kStreams, calls, threads_in_flight, threads_before);
  EXPECT_EQ(calls, kStreams);
  EXPECT_LE(threads_in_flight, kMaxThreads);

  decode_service.ReleaseAll();
  EXPECT_TRUE(Eventually([&] {
    for (const auto& s : streams) {
      if (!s->done()) return false;
    }
    return true;
  }));
  int finished = 0;
  for (const auto& s : streams) {
    if (s->Outcome() == "FINISH_REASON_LENGTH") {
      ++finished;
    } else if (finished < 3) {
      ADD_FAILURE() << s->Outcome();
    }
  }
  EXPECT_EQ(finished, kStreams);
  streams.clear();
  EXPECT_TRUE(Eventually([&] { return (*cluster)->active_calls() == 0; }));
  (*cluster)->Shutdown();
  coordinator->server->Shutdown(std::chrono::system_clock::now() +
                                std::chrono::seconds(1));
  for (RunningServer& w : workers) {
    w.server->Shutdown(std::chrono::system_clock::now() +
                       std::chrono::seconds(1));
  }
}

}  // namespace
}  // namespace baton::coordinator
