#include "worker/service/registrar.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc/keepalive.h"

namespace baton {

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

namespace {

std::shared_ptr<grpc::Channel> ControlChannel(
    const std::string& coordinator, const std::string& server_name,
    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  grpc::ChannelArguments args;
  SetClientKeepalive(&args);
  // A restarted coordinator gets its workers back within a few hundred
  // milliseconds, not after gRPC's default reconnect backoff (1 s, growing
  // to 2 minutes while it is down).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  if (!server_name.empty() && credentials != nullptr) {
    args.SetSslTargetNameOverride(server_name);
  }
  return grpc::CreateCustomChannel(
      coordinator,
      credentials != nullptr ? credentials : grpc::InsecureChannelCredentials(),
      args);
}

}  // namespace

Registrar::Registrar(const std::string& coordinator,
                     v1::RegisterWorkerRequest request, WorkerService* service,
                     std::function<absl::Status()> healthy,
                     std::shared_ptr<grpc::ChannelCredentials> credentials,
                     const std::string& server_name,
                     std::function<void()> on_registered)
    : coordinator_(coordinator),
      server_name_(server_name),
      stub_(v1::Coordinator::NewStub(
          ControlChannel(coordinator, server_name, std::move(credentials)))),
      request_(std::move(request)),
      service_(service),
      healthy_(std::move(healthy)),
      on_registered_(std::move(on_registered)),
      thread_([this] { Run(); }) {}

Registrar::~Registrar() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
  Deregister();
}

void Registrar::Log(const std::string& line) const {
  std::fprintf(stderr, "baton-worker: %s (coordinator %s)\n", line.c_str(),
               coordinator_.c_str());
}

std::vector<std::string> Registrar::OwnLeases() {
  return service_->LeasedRequestIds(
      coordinator_id_.empty() ? std::nullopt
                              : std::optional<std::string>(coordinator_id_));
}

void Registrar::CancelOwnLeases(const std::string& reason) {
  for (const std::string& id : OwnLeases()) service_->CancelRequest(id, reason);
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
        unreachable_.store(true);
        // A draining worker waits for no coordinator it cannot reach.
        if (drain) coordinator_leases_.store(0);
        wait = absl::Seconds(1);
        continue;
      }
      worker_id_ = response.worker_id();
      epoch_ = response.epoch();
      coordinator_id_ = response.coordinator_id();
      interval_ = absl::Milliseconds(response.heartbeat_interval_ms() > 0
                                         ? response.heartbeat_interval_ms()
                                         : 500.0);
      lease_ttl_ = absl::Milliseconds(
          response.lease_ttl_ms() > 0 ? response.lease_ttl_ms() : 3000.0);
      last_heartbeat_ok_ = absl::Now();
      unreachable_.store(false);
      service_->SetWorkerRef(worker_id_, request_.address());
      prefix_events_acked_.reset();
      drain_told_ = false;
      Log(absl::StrCat("registered as ", worker_id_, " epoch ", epoch_));
      if (on_registered_) on_registered_();
    }
    if (drain) Deregister(/*drain=*/true);
    v1::HeartbeatRequest heartbeat;
    heartbeat.set_worker_id(worker_id_);
    heartbeat.set_epoch(epoch_);
    *heartbeat.mutable_load() = service_->Load();
    for (const std::string& id : OwnLeases()) {
      heartbeat.add_leased_request_ids(id);
    }
    uint64_t prefix_events_sent = 0;
    *heartbeat.mutable_prefix_cache() =
        service_->PrefixCacheEvents(prefix_events_acked_, &prefix_events_sent);
    v1::HeartbeatResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    const grpc::Status status =
        stub_->Heartbeat(&context, heartbeat, &response);
    if (status.error_code() == grpc::StatusCode::NOT_FOUND ||
        status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      Log(absl::StrCat("coordinator dropped this worker (",
                       status.error_message(), "); re-registering"));
      CancelOwnLeases("stale registration");
      worker_id_.clear();
      wait = absl::ZeroDuration();
      continue;
    }
    if (status.ok()) {
      last_heartbeat_ok_ = absl::Now();
      prefix_events_acked_ = prefix_events_sent;
    } else {
      Log(absl::StrCat("heartbeat failed (", status.error_message(), ")"));
      if (absl::Now() - last_heartbeat_ok_ >= lease_ttl_) {
        // The coordinator has marked this worker DOWN by now and failed
        // its requests here, or it is gone: free what it held, as it
        // would have, and register again once it answers.
        Log(absl::StrCat("no heartbeat answered for ",
                         absl::FormatDuration(lease_ttl_),
                         "; freeing its requests here and registering again"));
        CancelOwnLeases("coordinator unreachable");
        unreachable_.store(true);
        worker_id_.clear();
        coordinator_leases_.store(0);
        wait = absl::Seconds(1);
        continue;
      }
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
