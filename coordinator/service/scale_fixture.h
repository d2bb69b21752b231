// A coordinator under thousands of streams inside one process, for
// GenerateScaleTest and coordinator_scale_bench: minimal fake workers (a
// prefill one that answers at once, a decode one that holds every stream
// until told to let them go) and a client of callback reactors, so the
// coordinator's own cost is what is measured.
#ifndef BATON_COORDINATOR_SERVICE_SCALE_FIXTURE_H_
#define BATON_COORDINATOR_SERVICE_SCALE_FIXTURE_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_callback.h>
#include <grpcpp/support/server_callback.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "baton/v1/api.grpc.pb.h"
#include "baton/v1/worker.grpc.pb.h"
#include "common/grpc/serving.h"
#include "coordinator/service/cluster.h"

namespace baton::coordinator::scale {

// The process's threads (/proc/self/status), -1 if unknown.
inline int ProcessThreads() {
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

// The Worker service of both fake workers: ReserveKv, SetKvTarget and
// Cancel succeed, Prefill streams its first token and ends, Decode is held.
class FakeWorker final : public v1::Worker::CallbackService {
 public:
  grpc::ServerUnaryReactor* ReserveKv(
      grpc::CallbackServerContext* context, const v1::ReserveKvRequest* request,
      v1::ReserveKvResponse* response) override {
    response->set_transfer_id(request->request_id());
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::MutexLock lock(&mu_);
    reserve_queue_ms_.push_back(request->queue_ms());
    reserve_arrivals_.push_back(request->arrival_unix_micros());
    if (hold_grants_ && request->queue_ms() <= 0) {
      held_reserves_.push_back(reactor);
    } else {
      reactor->Finish(grpc::Status::OK);
    }
    return reactor;
  }
  // From now on, ReserveKv calls that do not wait for room (queue_ms 0) are
  // answered only by AnswerHeld.
  void HoldGrants() {
    absl::MutexLock lock(&mu_);
    hold_grants_ = true;
  }
  // Answers the held ReserveKv calls and stops holding them.
  void AnswerHeld() {
    absl::MutexLock lock(&mu_);
    hold_grants_ = false;
    for (grpc::ServerUnaryReactor* r : held_reserves_) {
      r->Finish(grpc::Status::OK);
    }
    held_reserves_.clear();
  }
  // Each ReserveKv's queue_ms, in the order they came.
  std::vector<double> reserve_queue_ms() {
    absl::MutexLock lock(&mu_);
    return reserve_queue_ms_;
  }
  // Each ReserveKv's arrival_unix_micros, in the order they came.
  std::vector<int64_t> reserve_arrivals() {
    absl::MutexLock lock(&mu_);
    return reserve_arrivals_;
  }
  // The coordinator's default sends the reservation's target after the
  // Prefill; the fake's Prefill does not wait for it.
  grpc::ServerUnaryReactor* SetKvTarget(grpc::CallbackServerContext* context,
                                        const v1::SetKvTargetRequest*,
                                        v1::SetKvTargetResponse*) override {
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
      grpc::CallbackServerContext*,
      const v1::PrefillRequest* request) override {
    {
      absl::MutexLock lock(&mu_);
      (request->kv_target_follows() ? prefills_followed_
                                    : prefills_with_target_) += 1;
      arrivals_.push_back(request->arrival_unix_micros());
    }
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
  // Prefills whose KV target came with them, and those sent with
  // kv_target_follows.
  int prefills_with_target() {
    absl::MutexLock lock(&mu_);
    return prefills_with_target_;
  }
  int prefills_followed() {
    absl::MutexLock lock(&mu_);
    return prefills_followed_;
  }
  // Each Prefill's arrival_unix_micros, in the order they came.
  std::vector<int64_t> arrivals() {
    absl::MutexLock lock(&mu_);
    return arrivals_;
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
  int prefills_with_target_ ABSL_GUARDED_BY(mu_) = 0;
  int prefills_followed_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> arrivals_ ABSL_GUARDED_BY(mu_);
  bool hold_grants_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<grpc::ServerUnaryReactor*> held_reserves_ ABSL_GUARDED_BY(mu_);
  std::vector<double> reserve_queue_ms_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> reserve_arrivals_ ABSL_GUARDED_BY(mu_);
};

// One client stream: counts what arrives, records how it ended.
class ClientStream final
    : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  explicit ClientStream(v1::Baton::Stub* stub)
      : sent_(std::chrono::steady_clock::now()) {
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
      if (messages_ == 0) first_ = std::chrono::steady_clock::now();
      messages_ += 1;
      if (response_.has_result()) {
        finish_reason_ = response_.result().finish_reason();
        result_ = response_.result();
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
  // Client send to the first message, in ms (-1 before it).
  double ClientTtftMs() {
    absl::MutexLock lock(&mu_);
    if (messages_ == 0) return -1;
    return std::chrono::duration<double, std::milli>(first_ - sent_).count();
  }
  v1::GenerateResult result() {
    absl::MutexLock lock(&mu_);
    return result_;
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
  const std::chrono::steady_clock::time_point sent_;
  grpc::ClientContext context_;
  v1::GenerateRequest request_;
  v1::GenerateResponse response_;
  absl::Mutex mu_;
  int messages_ ABSL_GUARDED_BY(mu_) = 0;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  v1::FinishReason finish_reason_ ABSL_GUARDED_BY(mu_) =
      v1::FINISH_REASON_UNSPECIFIED;
  std::chrono::steady_clock::time_point first_ ABSL_GUARDED_BY(mu_);
  v1::GenerateResult result_ ABSL_GUARDED_BY(mu_);
};

// Polls `done` every 10 ms; false after `guard` (a hang guard only).
template <typename F>
inline bool Eventually(F done, absl::Duration guard = absl::Minutes(5)) {
  const absl::Time deadline = absl::Now() + guard;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

// Cluster options for `streams` concurrent requests on fake workers: no
// heartbeats are needed for the run's length, admission and timers do not
// cut a slow run short.
inline ClusterOptions ScaleOptions(int streams) {
  ClusterOptions options;
  options.registry.heartbeat_interval = absl::Seconds(300);
  options.registry.suspect_after = absl::Seconds(600);
  options.registry.lease_ttl = absl::Seconds(1200);
  options.admission.max_waiting_requests = 2 * streams;
  options.admission.max_running_requests = 2 * streams;
  options.queue_timeout = absl::Hours(1);
  options.transfer_timeout = absl::Hours(1);
  return options;
}

// Registers a fake worker of `role` at `address` with `control`; a
// `kv_device` says its KV pool is on that device, of `kv_blocks` blocks.
inline absl::Status RegisterFakeWorker(v1::Coordinator::Stub& control,
                                       const std::string& address,
                                       v1::WorkerRole role,
                                       const std::string& model_id,
                                       const std::string& kv_device = "",
                                       int64_t kv_blocks = int64_t{1} << 24) {
  v1::RegisterWorkerRequest request;
  request.set_role(role);
  request.set_address(address);
  request.set_model_id(model_id);
  v1::KvLayout* layout = request.mutable_kv_layout();
  layout->set_num_layers(30);
  layout->set_num_kv_heads(3);
  layout->set_head_dim(64);
  layout->set_block_size(16);
  layout->set_dtype(v1::KV_DTYPE_F16);
  request.set_kv_blocks_total(kv_blocks);
  if (!kv_device.empty()) {
    request.add_kv_transports(v1::KV_TRANSPORT_CUDA_IPC);
    request.set_kv_device(kv_device);
  }
  request.add_kv_transports(v1::KV_TRANSPORT_HOST_TCP);
  request.set_context_length(8192);
  request.set_vocab_size(49152);
  grpc::ClientContext context;
  v1::RegisterWorkerResponse response;
  const grpc::Status status =
      control.RegisterWorker(&context, request, &response);
  if (status.ok()) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("RegisterWorker: ", status.error_message()));
}

// Ends the cluster's calls, then stops the coordinator's and the workers'
// servers (1 s grace each).
inline void StopAll(Cluster& cluster, RunningServer& coordinator,
                    std::vector<RunningServer>& workers) {
  cluster.Shutdown();
  coordinator.server->Shutdown(std::chrono::system_clock::now() +
                               std::chrono::seconds(1));
  for (RunningServer& w : workers) {
    w.server->Shutdown(std::chrono::system_clock::now() +
                       std::chrono::seconds(1));
  }
}

}  // namespace baton::coordinator::scale

#endif  // BATON_COORDINATOR_SERVICE_SCALE_FIXTURE_H_
