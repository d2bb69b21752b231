#include "coordinator/service/coordinator_services.h"

#include <map>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc/grpc_status.h"
#include "common/tsan/annotations.h"
#include "coordinator/routing_policy.h"
#include "coordinator/service/generate_call.h"
#include "proto/convert.h"

namespace baton::coordinator {
namespace {

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context,
                                 const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

absl::StatusOr<WorkerRole> RoleFromProto(v1::WorkerRole role) {
  switch (role) {
    case v1::WORKER_ROLE_PREFILL:
      return WorkerRole::kPrefill;
    case v1::WORKER_ROLE_DECODE:
      return WorkerRole::kDecode;
    case v1::WORKER_ROLE_BOTH:
      return WorkerRole::kBoth;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("role: ", static_cast<int>(role),
                       " is not one of PREFILL, DECODE, BOTH"));
  }
}

v1::WorkerRole RoleToProto(WorkerRole role) {
  switch (role) {
    case WorkerRole::kPrefill:
      return v1::WORKER_ROLE_PREFILL;
    case WorkerRole::kDecode:
      return v1::WORKER_ROLE_DECODE;
    case WorkerRole::kBoth:
      return v1::WORKER_ROLE_BOTH;
  }
  return v1::WORKER_ROLE_UNSPECIFIED;
}

v1::WorkerHealth HealthToProto(WorkerHealth health) {
  switch (health) {
    case WorkerHealth::kHealthy:
      return v1::WORKER_HEALTH_HEALTHY;
    case WorkerHealth::kSuspect:
      return v1::WORKER_HEALTH_SUSPECT;
    case WorkerHealth::kDown:
      return v1::WORKER_HEALTH_DOWN;
    case WorkerHealth::kDraining:
      return v1::WORKER_HEALTH_DRAINING;
  }
  return v1::WORKER_HEALTH_UNSPECIFIED;
}

WorkerLoad LoadFromProto(const v1::WorkerLoad& proto) {
  WorkerLoad load;
  load.queued_prefill_tokens = proto.queued_prefill_tokens();
  load.running_sequences = proto.running_sequences();
  load.kv_blocks_free = proto.kv_blocks_free();
  load.kv_blocks_total = proto.kv_blocks_total();
  load.kv_blocks_reserved = proto.kv_blocks_reserved();
  load.queued_reservations = proto.queued_reservations();
  load.engine_steps = proto.engine_steps();
  load.prefill_tokens_per_second = proto.prefill_tokens_per_second();
  return load;
}

v1::WorkerLoad LoadToProto(const WorkerLoad& load) {
  v1::WorkerLoad proto;
  proto.set_queued_prefill_tokens(load.queued_prefill_tokens);
  proto.set_running_sequences(load.running_sequences);
  proto.set_kv_blocks_free(load.kv_blocks_free);
  proto.set_kv_blocks_total(load.kv_blocks_total);
  proto.set_kv_blocks_reserved(load.kv_blocks_reserved);
  proto.set_queued_reservations(load.queued_reservations);
  proto.set_engine_steps(load.engine_steps);
  proto.set_prefill_tokens_per_second(load.prefill_tokens_per_second);
  return proto;
}

}  // namespace

absl::Status Authorize(ApiKeys* keys,
                       const grpc::CallbackServerContext* context) {
  if (keys == nullptr) return absl::OkStatus();
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return keys->Check("");
  return keys->Check(absl::string_view(it->second.data(), it->second.size()));
}

// --- Control plane -----------------------------------------------------------

grpc::ServerUnaryReactor* ControlPlaneService::RegisterWorker(
    grpc::CallbackServerContext* context,
    const v1::RegisterWorkerRequest* request,
    v1::RegisterWorkerResponse* response) {
  const TsanHandlerScope handler(this);  // see common/tsan/annotations.h
  auto role = RoleFromProto(request->role());
  if (!role.ok()) return Finish(context, role.status());
  auto layout = FromProto(request->kv_layout());
  if (!layout.ok()) return Finish(context, layout.status());
  const std::string& served = cluster_->model().id();
  if (request->model_id() != served) {
    return Finish(
        context,
        absl::InvalidArgumentError(absl::StrCat(
            "model_id: '", absl::CHexEscape(request->model_id().substr(0, 200)),
            request->model_id().size() > 200 ? "...' (" : "' (",
            request->model_id().size(),
            " bytes) differs from the coordinator's model '", served, "'")));
  }
  WorkerRegistration registration;
  registration.role = *role;
  registration.worker_id = request->worker_id();
  registration.incarnation = request->incarnation();
  registration.address = request->address();
  registration.model_id = request->model_id();
  registration.kv_layout = *layout;
  registration.kv_blocks_total = request->kv_blocks_total();
  registration.context_length = request->context_length();
  if (!request->prefix_root().empty()) {
    if (request->prefix_root().size() != 16) {
      return Finish(context, absl::InvalidArgumentError(absl::StrCat(
                                 "prefix_root: must be 16 bytes, got ",
                                 request->prefix_root().size())));
    }
    registration.prefix_root = HashFromBytes(request->prefix_root());
  }
  if (constexpr size_t kMaxKvDevice = 256;
      request->kv_device().size() > kMaxKvDevice) {
    return Finish(context, absl::InvalidArgumentError(absl::StrCat(
                               "kv_device: at most ", kMaxKvDevice,
                               " bytes, got ", request->kv_device().size())));
  }
  registration.kv_device = request->kv_device();
  auto ref = cluster_->registry().Register(registration);
  if (!ref.ok()) return Finish(context, ref.status());
  // A new registration starts from the snapshot its first heartbeat sends.
  cluster_->prefix_index().Forget(ref->id);
  const WorkerRegistryOptions& options = cluster_->registry().options();
  response->set_worker_id(ref->id);
  response->set_epoch(ref->epoch);
  response->set_heartbeat_interval_ms(
      absl::ToDoubleMilliseconds(options.heartbeat_interval));
  response->set_lease_ttl_ms(absl::ToDoubleMilliseconds(options.lease_ttl));
  response->set_coordinator_id(cluster_->options().coordinator_id);
  std::fprintf(
      stderr, "baton-coordinator: registered %s (%s) at %s, %lld KV blocks\n",
      WorkerRefString(*ref).c_str(), std::string(WorkerRoleName(*role)).c_str(),
      request->address().c_str(),
      static_cast<long long>(request->kv_blocks_total()));
  return Finish(context, absl::OkStatus());
}

void ControlPlaneService::ApplyPrefixCacheEvents(
    const WorkerRef& ref, const v1::PrefixCacheEvents& events,
    int64_t kv_blocks_total) {
  if (!events.snapshot() && events.stored().empty() &&
      events.removed().empty()) {
    return;
  }
  auto stored = UnpackHashes(events.stored());
  auto removed = UnpackHashes(events.removed());
  if (!stored.ok() || !removed.ok()) {
    // The lease stands; only the routing hint is lost until the worker's
    // next registration.
    std::fprintf(
        stderr,
        "baton-coordinator: %s sent bad prefix cache events (%s); "
        "forgetting its cache\n",
        WorkerRefString(ref).c_str(),
        (!stored.ok() ? stored.status() : removed.status()).ToString().c_str());
    cluster_->prefix_index().Forget(ref.id);
    return;
  }
  if (!cluster_->prefix_index().Apply(ref.id, events.snapshot(), *stored,
                                      *removed, kv_blocks_total)) {
    std::fprintf(stderr,
                 "baton-coordinator: %s reported more cached blocks than "
                 "its %lld-block KV pool; forgetting its cache\n",
                 WorkerRefString(ref).c_str(),
                 static_cast<long long>(kv_blocks_total));
  }
}

grpc::ServerUnaryReactor* ControlPlaneService::Heartbeat(
    grpc::CallbackServerContext* context, const v1::HeartbeatRequest* request,
    v1::HeartbeatResponse* response) {
  const TsanHandlerScope handler(this);  // see common/tsan/annotations.h
  const WorkerRef ref{request->worker_id(), request->epoch()};
  std::vector<std::string> leased(request->leased_request_ids().begin(),
                                  request->leased_request_ids().end());
  if (absl::Status s =
          cluster_->Heartbeat(ref, LoadFromProto(request->load()), leased);
      !s.ok()) {
    return Finish(context, s);
  }
  response->set_lease_ttl_ms(
      absl::ToDoubleMilliseconds(cluster_->registry().options().lease_ttl));
  // The registry checked it against the registration.
  ApplyPrefixCacheEvents(ref, request->prefix_cache(),
                         request->load().kv_blocks_total());
  for (std::string& id : cluster_->requests().Orphans(ref, leased)) {
    response->add_orphaned_request_ids(std::move(id));
  }
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* ControlPlaneService::DeregisterWorker(
    grpc::CallbackServerContext* context,
    const v1::DeregisterWorkerRequest* request,
    v1::DeregisterWorkerResponse* response) {
  const TsanHandlerScope handler(this);  // see common/tsan/annotations.h
  const WorkerRef ref{request->worker_id(), request->epoch()};
  if (request->drain()) {
    // Routing skips it from now on; its requests go on.
    const absl::StatusOr<WorkerInfo> before = cluster_->registry().Get(ref.id);
    const bool was_draining =
        before.ok() && before->health == WorkerHealth::kDraining;
    absl::Status status = cluster_->registry().Drain(ref);
    if (status.ok()) {
      int32_t live = 0;
      for (const Lease& lease : cluster_->requests().LiveLeasesOn(ref.id)) {
        if (lease.worker.epoch == ref.epoch) ++live;
      }
      response->set_live_leases(live);
      if (!was_draining) {
        std::fprintf(stderr, "baton-coordinator: %s is draining\n",
                     WorkerRefString(ref).c_str());
      }
    }
    return Finish(context, status);
  }
  absl::Status status = cluster_->registry().Remove(ref, "deregistered");
  if (status.ok()) {
    cluster_->prefix_index().Forget(ref.id);
    cluster_->Sweep();  // fail its requests now
  }
  return Finish(context, status);
}

// --- Public API --------------------------------------------------------------

grpc::ServerWriteReactor<v1::GenerateResponse>* BatonService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  const TsanHandlerScope handler(this);  // see common/tsan/annotations.h
  const absl::Time arrival = absl::Now();
  auto* reactor = new GenerateReactor();
  if (absl::Status auth = Authorize(api_keys_, context); !auth.ok()) {
    cluster_->metrics().OnRequestRejected(auth);
    reactor->Close(ToGrpcStatus(auth));
    return reactor;
  }
  if (!cluster_->accepting()) {
    const absl::Status refused =
        absl::UnavailableError("coordinator shutting down");
    cluster_->metrics().OnRequestRejected(refused);
    reactor->Close(ToGrpcStatus(refused));
    return reactor;
  }
  const auto deadline = context->deadline();
  const absl::Time absl_deadline =
      deadline >= std::chrono::system_clock::time_point::max() -
                      std::chrono::hours(24 * 365)
          ? absl::InfiniteFuture()
          : absl::FromChrono(deadline);
  auto job = PrepareGenerate(cluster_->model(), cluster_->options(), *request,
                             absl_deadline);
  if (!job.ok()) {
    cluster_->metrics().OnRequestRejected(job.status());
    reactor->Close(ToGrpcStatus(job.status()));
    return reactor;
  }
  job->arrival = arrival;
  const AdmissionVerdict admitted =
      cluster_->Admit(RoutingInfo(*job, cluster_->model().id()));
  if (!admitted.status.ok()) {
    context->AddTrailingMetadata(
        kRetryAfterMsKey,
        absl::StrCat(absl::ToInt64Milliseconds(admitted.retry_after)));
    reactor->Close(ToGrpcStatus(admitted.status));
    return reactor;
  }
  GenerateCall::Start(cluster_, std::move(*job), reactor);
  return reactor;
}

grpc::ServerUnaryReactor* BatonService::Tokenize(
    grpc::CallbackServerContext* context, const v1::TokenizeRequest* request,
    v1::TokenizeResponse* response) {
  const TsanHandlerScope handler(this);  // see common/tsan/annotations.h
  if (absl::Status auth = Authorize(api_keys_, context); !auth.ok()) {
    return Finish(context, auth);
  }
  const ServedModel& model = cluster_->model();
  if (!request->model().empty() && request->model() != model.id()) {
    return Finish(context,
                  absl::NotFoundError(absl::StrCat(
                      "model: '", request->model(),
                      "' is not served here (served: '", model.id(), "')")));
  }
  auto ids = model.EncodeInput(*request);
  if (!ids.ok()) return Finish(context, ids.status());
  for (int32_t id : *ids) {
    response->add_token_ids(id);
    response->add_pieces(model.tokenizer().TokenToBytes(id));
  }
  response->set_max_request_tokens(
      LargestDecodePool(cluster_->RoutingCandidates(), model.id()).tokens());
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* BatonService::ListModels(
    grpc::CallbackServerContext* context,
    const v1::ListModelsRequest* /*request*/,
    v1::ListModelsResponse* response) {
  const TsanHandlerScope handler(this);  // see common/tsan/annotations.h
  if (absl::Status auth = Authorize(api_keys_, context); !auth.ok()) {
    return Finish(context, auth);
  }
  std::map<std::string, v1::ModelInfo> models;
  for (const WorkerInfo& w : cluster_->registry().List()) {
    if (w.health != WorkerHealth::kHealthy) continue;
    v1::ModelInfo& info = models[w.registration.model_id];
    info.set_id(w.registration.model_id);
    switch (w.registration.role) {
      case WorkerRole::kPrefill:
        info.set_prefill_workers(info.prefill_workers() + 1);
        break;
      case WorkerRole::kDecode:
        info.set_decode_workers(info.decode_workers() + 1);
        break;
      case WorkerRole::kBoth:
        info.set_colocated_workers(info.colocated_workers() + 1);
        break;
    }
  }
  const ServedModel& served = cluster_->model();
  for (auto& [id, info] : models) {
    if (id == served.id()) {
      info.set_architecture(served.config().architecture);
      info.set_context_length(
          static_cast<int32_t>(served.config().context_length));
      info.set_vocab_size(static_cast<int32_t>(served.config().vocab_size));
    }
    *response->add_models() = std::move(info);
  }
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* BatonService::GetClusterStatus(
    grpc::CallbackServerContext* context,
    const v1::GetClusterStatusRequest* request,
    v1::GetClusterStatusResponse* response) {
  const TsanHandlerScope handler(this);  // see common/tsan/annotations.h
  if (absl::Status auth = Authorize(api_keys_, context); !auth.ok()) {
    return Finish(context, auth);
  }
  const absl::Time now = cluster_->clock().Now();
  std::map<WorkerId, int32_t> active;
  for (const Lease& lease : cluster_->requests().LiveLeases()) {
    ++active[lease.worker.id];
  }
  for (const WorkerInfo& w : cluster_->registry().List()) {
    if (w.health == WorkerHealth::kDown && !request->include_down()) continue;
    v1::WorkerStatus* status = response->add_workers();
    status->mutable_worker()->set_worker_id(w.ref.id);
    status->mutable_worker()->set_address(w.registration.address);
    status->set_role(RoleToProto(w.registration.role));
    status->set_model_id(w.registration.model_id);
    status->set_health(HealthToProto(w.health));
    *status->mutable_load() = LoadToProto(w.load);
    *status->mutable_kv_layout() = ToProto(w.registration.kv_layout);
    status->set_last_heartbeat_age_ms(
        absl::ToDoubleMilliseconds(now - w.last_heartbeat));
    status->set_epoch(w.ref.epoch);
    status->set_active_requests(active[w.ref.id]);
    status->set_prefix_cache_blocks(
        cluster_->prefix_index().NumBlocks(w.ref.id));
  }
  response->set_active_requests(cluster_->active_calls());
  return Finish(context, absl::OkStatus());
}

}  // namespace baton::coordinator
