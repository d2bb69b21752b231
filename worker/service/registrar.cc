#include "worker/service/registrar.h"

#include <chrono>
#include <cstdio>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"

namespace baton {
namespace {

void Log(const std::string& line) {
  std::fprintf(stderr, "baton-worker: %s\n", line.c_str());
}

}  // namespace

void SetWorkerIdentity(const std::string& worker_id,
                       v1::RegisterWorkerRequest* request) {
  std::random_device random;
  request->set_worker_id(
      worker_id.empty()
          ? absl::StrCat("w-", absl::Hex(random(), absl::kZeroPad8))
          : worker_id);
  uint64_t incarnation = 0;
  while (incarnation == 0) {
    incarnation = (uint64_t{random()} << 32) | random();
  }
  request->set_incarnation(incarnation);
}

Registrar::Registrar(const std::string& coordinator,
                     v1::RegisterWorkerRequest request, WorkerService* service,
                     std::function<absl::Status()> healthy,
                     std::shared_ptr<grpc::ChannelCredentials> credentials)
    : stub_(v1::Coordinator::NewStub(grpc::CreateChannel(
          coordinator, credentials != nullptr
                           ? credentials
                           : grpc::InsecureChannelCredentials()))),
      request_(std::move(request)),
      service_(service),
      healthy_(std::move(healthy)),
      thread_([this] { Run(); }) {}

Registrar::~Registrar() {
  stop_.Notify();
  thread_.join();
  Deregister();
}

void Registrar::Deregister() {
  if (!worker_id_.empty()) {
    v1::DeregisterWorkerRequest request;
    request.set_worker_id(worker_id_);
    request.set_epoch(epoch_);
    v1::DeregisterWorkerResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(1));
    stub_->DeregisterWorker(&context, request, &response).ok();
    worker_id_.clear();
  }
}

void Registrar::SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(2));
}

void Registrar::Run() {
  absl::Duration wait = absl::ZeroDuration();
  while (!stop_.WaitForNotificationWithTimeout(wait)) {
    if (absl::Status health = healthy_(); !health.ok()) {
      Log(absl::StrCat("unhealthy, deregistering: ", health.ToString()));
      Deregister();
      return;
    }
    if (worker_id_.empty()) {
      v1::RegisterWorkerResponse response;
      grpc::ClientContext context;
      SetDeadline(&context);
      const grpc::Status status =
          stub_->RegisterWorker(&context, request_, &response);
      if (!status.ok()) {
        Log(absl::StrCat("register failed (", status.error_message(),
                         "); retrying"));
        wait = absl::Seconds(1);
        continue;
      }
      worker_id_ = response.worker_id();
      epoch_ = response.epoch();
      interval_ = absl::Milliseconds(response.heartbeat_interval_ms() > 0
                                         ? response.heartbeat_interval_ms()
                                         : 500.0);
      service_->SetWorkerRef(worker_id_, request_.address());
      Log(absl::StrCat("registered as ", worker_id_, " epoch ", epoch_));
    }
    v1::HeartbeatRequest heartbeat;
    heartbeat.set_worker_id(worker_id_);
    heartbeat.set_epoch(epoch_);
    *heartbeat.mutable_load() = service_->Load();
    for (const std::string& id : service_->LeasedRequestIds()) {
      heartbeat.add_leased_request_ids(id);
    }
    v1::HeartbeatResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    const grpc::Status status =
        stub_->Heartbeat(&context, heartbeat, &response);
    if (status.error_code() == grpc::StatusCode::NOT_FOUND ||
        status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      Log(absl::StrCat("coordinator dropped this worker (",
                       status.error_message(), "); re-registering"));
      for (const std::string& id : service_->LeasedRequestIds()) {
        service_->CancelRequest(id, "stale registration");
      }
      worker_id_.clear();
      wait = absl::ZeroDuration();
      continue;
    }
    if (!status.ok()) {
      Log(absl::StrCat("heartbeat failed (", status.error_message(), ")"));
    }
    for (const std::string& id : response.orphaned_request_ids()) {
      service_->CancelRequest(id, "orphaned");
    }
    for (const std::string& id : service_->ExpireReservations()) {
      Log(absl::StrCat("KV reservation of ", id,
                       " expired before its transfer started"));
    }
    wait = interval_;
  }
}

}  // namespace baton
