#include "worker/service/registrar.h"

#include <algorithm>
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
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
  Deregister();
}

void Registrar::StartDraining() {
  absl::MutexLock lock(&mu_);
  drain_ = true;
}

void Registrar::Deregister(bool drain) {
  if (worker_id_.empty()) return;
  v1::DeregisterWorkerRequest request;
  request.set_worker_id(worker_id_);
  request.set_epoch(epoch_);
  request.set_drain(drain);
  v1::DeregisterWorkerResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(1));
  const grpc::Status status =
      stub_->DeregisterWorker(&context, request, &response);
  if (drain) {
    // Repeated every interval while draining: its answer counts the
    // coordinator's leases left here.
    if (status.ok()) {
      coordinator_leases_.store(response.live_leases());
      if (!drain_told_) {
        Log("draining: the coordinator routes nothing new here");
      }
    } else {
      // A coordinator that cannot be reached, or no longer knows this
      // incarnation, holds nothing here that the drain could wait for.
      coordinator_leases_.store(0);
      Log(absl::StrCat("drain not acknowledged (", status.error_message(),
                       "); telling it again while requests run here"));
    }
    drain_told_ = status.ok();
  } else {
    worker_id_.clear();
  }
}

void Registrar::SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(2));
}

void Registrar::Run() {
  absl::Duration wait = absl::ZeroDuration();
  while (true) {
    bool drain = false;
    {
      // Wakes for a stop, or at once for a new drain (a drain the
      // coordinator did not acknowledge is told again each interval).
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(
          absl::Condition(
              +[](Registrar* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) {
                return r->stop_ || (r->drain_ && !r->drain_noticed_);
              },
              this),
          wait);
      if (stop_) return;
      drain = drain_;
      drain_noticed_ = drain_;
    }
    if (absl::Status health = healthy_(); !health.ok()) {
      // Leave only once the coordinator has seen the requests that failed
      // here end (their streams carry the failure; a removal first would
      // replace it with "worker went down"): drain, then deregister when it
      // holds no lease here, or after kUnhealthyDrain.
      const absl::Time now = absl::Now();
      if (unhealthy_since_ == absl::InfiniteFuture()) {
        unhealthy_since_ = now;
        Log(absl::StrCat("unhealthy, draining then deregistering: ",
                         health.ToString()));
      }
      if (!worker_id_.empty()) Deregister(/*drain=*/true);
      if (worker_id_.empty() || coordinator_leases_.load() == 0 ||
          now - unhealthy_since_ >= kUnhealthyDrain) {
        Log("unhealthy: deregistering");
        Deregister();
        return;
      }
      // Heartbeats go on meanwhile, so its lease does not expire.
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
      drain_told_ = false;
      Log(absl::StrCat("registered as ", worker_id_, " epoch ", epoch_));
    }
    if (drain) Deregister(/*drain=*/true);
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
    wait = unhealthy_since_ == absl::InfiniteFuture()
               ? interval_
               : std::min(interval_, absl::Milliseconds(50));
  }
}

}  // namespace baton
