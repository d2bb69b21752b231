// The decode half of WorkerService: KV reservations, imports landing, Decode
// streams, and starting an imported sequence on the engine.
#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/fault/fault_points.h"
#include "common/tsan/annotations.h"
#include "worker/engine/scheduler.h"
#include "worker/service/proto_convert.h"
#include "worker/service/worker_service.h"
#include "worker/service/worker_service_internal.h"
#include "worker/transport/kv_wire.h"

namespace baton {
namespace {

// A ReserveKv that waits in the ReservationQueue: its request is read and its
// response written on the queue's thread, then gRPC destroys both on one of
// its own after OnDone. gRPC is not built with TSan, so the release before
// Finish and the acquire in OnDone (on the reactor's address: no field is
// read before it) make that hand-off visible to it.
class QueuedReserveReactor final : public grpc::ServerUnaryReactor {
 public:
  void FinishHere(const absl::Status& status) {
    BATON_TSAN_RELEASE(this);
    Finish(ToGrpcStatus(status));
  }
  void OnDone() override {
    BATON_TSAN_ACQUIRE(this);
    delete this;
  }
};

}  // namespace

void WorkerService::OnLanded(const std::string& request_id,
                             absl::Status status) {
  DecodeReactor* waiting = nullptr;
  v1::DecodeRequest request;
  SteadyClock::time_point since;
  {
    absl::MutexLock lock(&mu_);
    auto it = imports_.find(request_id);
    if (it == imports_.end()) return;
    PendingImport& pending = it->second;
    pending.landed = true;
    pending.landed_status = status;
    if (pending.waiting == nullptr) return;
    waiting = pending.waiting;
    request = std::move(pending.waiting_request);
    since = pending.waiting_since;
    imports_.erase(it);
    // Still leased, in the same critical section: LeasedRequestIds would
    // otherwise drop its owner tag in between.
    if (status.ok()) running_.insert(request_id);
  }
  if (!status.ok()) {
    const absl::Status failed = absl::AbortedError(
        absl::StrCat("KV transfer failed: ", status.message()));
    RecordEnd("decode", failed);
    waiting->Close(ToGrpcStatus(failed));
    return;
  }
  StartImportedDecode(request, waiting, since);
}

grpc::ServerUnaryReactor* WorkerService::ReserveKv(
    grpc::CallbackServerContext* context, const v1::ReserveKvRequest* request,
    v1::ReserveKvResponse* response) {
  const TsanHandlerScope handler(this);  // see common/tsan/annotations.h
  if (options_.role == v1::WORKER_ROLE_PREFILL) {
    return FinishUnary(context, absl::FailedPreconditionError(
                                    "ReserveKv: this worker has the prefill "
                                    "role and receives no KV"));
  }
  const std::string& id = request->request_id();
  if (id.empty()) {
    return FinishUnary(context,
                       absl::InvalidArgumentError("request_id: required"));
  }
  if (!options_.model_id.empty() && !request->model_id().empty() &&
      request->model_id() != options_.model_id) {
    return FinishUnary(context, absl::InvalidArgumentError(absl::StrCat(
                                    "model_id: '", request->model_id(),
                                    "' differs from this worker's '",
                                    options_.model_id, "'")));
  }
  if (request->has_kv_layout() &&
      !LayoutEquals(request->kv_layout(), engine_->kv_cache().layout())) {
    return FinishUnary(
        context,
        absl::InvalidArgumentError(absl::StrCat(
            "kv_layout: ", request->kv_layout().ShortDebugString(),
            " differs from this worker's ",
            ToProto(engine_->kv_cache().layout()).ShortDebugString())));
  }
  if (request->num_prompt_tokens() < 1) {
    return FinishUnary(context,
                       absl::InvalidArgumentError(absl::StrCat(
                           "num_prompt_tokens: ", request->num_prompt_tokens(),
                           " must be >= 1")));
  }
  if (!(request->queue_ms() >= 0 && request->queue_ms() <= 3.6e6)) {
    return FinishUnary(context, absl::InvalidArgumentError(absl::StrCat(
                                    "queue_ms: ", request->queue_ms(),
                                    " must be in [0, 3600000]")));
  }
  if (!(request->reservation_ttl_ms() >= 0 &&
        request->reservation_ttl_ms() <= 3.6e6)) {
    return FinishUnary(
        context, absl::InvalidArgumentError(absl::StrCat(
                     "reservation_ttl_ms: ", request->reservation_ttl_ms(),
                     " must be in [0, 3600000] (0: the worker's "
                     "--reservation_ttl_ms)")));
  }
  // Calls that wait for room are served in arrival order: none goes ahead
  // of them.
  if (reserve_queue_->size() == 0) {
    absl::Status reserved = Reserve(*request, response);
    if (!absl::IsResourceExhausted(reserved) || request->queue_ms() <= 0) {
      return FinishUnary(context, reserved);
    }
  } else if (request->queue_ms() <= 0) {
    return FinishUnary(
        context, absl::ResourceExhaustedError(absl::StrCat(
                     "ReserveKv of '", id, "': ", reserve_queue_->size(),
                     " reservations wait for KV room here first, and this "
                     "one has no queue_ms")));
  }
  auto* reactor = new QueuedReserveReactor();
  ReservationQueue::Entry entry;
  entry.request_id = id;
  entry.reserve = [this, request, response] {
    return Reserve(*request, response);
  };
  entry.finish = [reactor](absl::Status status) {
    reactor->FinishHere(status);
  };
  entry.cancelled = [context] { return context->IsCancelled(); };
  entry.until = absl::Now() + absl::Milliseconds(request->queue_ms());
  entry.arrival_us = FcfsArrivalNow(request->arrival_unix_micros());
  if (absl::Status added = reserve_queue_->Add(std::move(entry)); !added.ok()) {
    reactor->FinishHere(added);
  }
  return reactor;
}

absl::Status WorkerService::Reserve(const v1::ReserveKvRequest& request,
                                    v1::ReserveKvResponse* response) {
  const std::string& id = request.request_id();
  // Unguessable: a transfer id names a reservation anyone on the KV network
  // could otherwise quote, and the secret is what its sender must prove.
  const uint64_t transfer_id = NewKvTransferId();
  const std::string secret = NewKvSecret();
  {
    absl::MutexLock lock(&mu_);
    if (imports_.contains(id) || locals_.contains(id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("request_id: '", id, "' already holds KV here"));
    }
    PendingImport& pending = imports_[id];
    pending.transfer_id = transfer_id;
    TagLeaseLocked(id, request.coordinator_id());
    const absl::Duration ttl =
        request.reservation_ttl_ms() > 0
            ? absl::Milliseconds(request.reservation_ttl_ms())
            : options_.reservation_ttl;
    pending.expires = absl::Now() + ttl;
  }
  ImportOptions import_options;
  import_options.transfer_id = transfer_id;
  import_options.secret = secret;
  import_options.model_id = options_.model_id;
  import_options.num_prompt_tokens = request.num_prompt_tokens();
  import_options.max_tokens = request.max_tokens();
  import_options.prompt.assign(request.prompt_token_ids().begin(),
                               request.prompt_token_ids().end());
  import_options.on_landed = [this, id](absl::Status status) {
    OnLanded(id, std::move(status));
  };
  absl::StatusOr<ImportReservation> reservation =
      engine_->ReserveImport(id, import_options);
  if (!reservation.ok()) {
    absl::MutexLock lock(&mu_);
    imports_.erase(id);
    return reservation.status();
  }
  response->set_transfer_id(absl::StrCat(transfer_id));
  response->set_transfer_secret(secret);
  response->mutable_endpoint()->set_transport(v1::KV_TRANSPORT_HOST_TCP);
  response->mutable_endpoint()->set_address(receiver_->endpoint());
  if (device_receiver_ != nullptr) {
    v1::KvEndpoint* device = response->add_alternatives();
    device->set_transport(options_.device_kv_transport);
    device->set_address(device_receiver_->endpoint());
    device->set_device(options_.kv_device);
  }
  if (options_.expect_nccl && !options_.kv_device.empty()) {
    v1::KvEndpoint* nccl = response->add_alternatives();
    nccl->set_transport(v1::KV_TRANSPORT_NCCL);
    absl::MutexLock lock(&mu_);
    nccl->set_address(ref_.address());
    nccl->set_device(options_.kv_device);
  }
  response->set_blocks_reserved(reservation->num_blocks);
  response->set_cached_blocks(reservation->cached_blocks);
  if (absl::Status lost = FaultPoints::Global().Hit(kFaultKvReserved);
      !lost.ok()) {
    // The blocks stay reserved: the caller must free them (Cancel).
    return absl::UnavailableError(absl::StrCat(
        "ReserveKv of '", id, "': the reply was lost (", lost.message(), ")"));
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* WorkerService::PairKv(
    grpc::CallbackServerContext* context, const v1::PairKvRequest* request,
    v1::PairKvResponse* response) {
  const TsanHandlerScope handler(this);  // see common/tsan/annotations.h
  if (!options_.expect_nccl) {
    return FinishUnary(context, absl::UnimplementedError(
                                    "PairKv: this worker receives no KV over "
                                    "NCCL"));
  }
  uint64_t transfer_id = 0;
  if (!absl::SimpleAtoi(request->transfer_id(), &transfer_id)) {
    return FinishUnary(context, absl::InvalidArgumentError(absl::StrCat(
                                    "transfer_id: '", request->transfer_id(),
                                    "' is not a transfer id from ReserveKv")));
  }
  if (request->prefill_worker().worker_id().empty() &&
      request->prefill_worker().address().empty()) {
    return FinishUnary(context, absl::InvalidArgumentError(
                                    "prefill_worker: worker_id or address "
                                    "required"));
  }
  std::string decode_id;
  {
    absl::MutexLock lock(&mu_);
    auto it = imports_.find(request->request_id());
    if (it == imports_.end() || it->second.transfer_id != transfer_id) {
      return FinishUnary(
          context, absl::NotFoundError(absl::StrCat(
                       "PairKv: no KV reservation '", request->transfer_id(),
                       "' for request '", request->request_id(), "'")));
    }
    decode_id = !ref_.worker_id().empty() ? ref_.worker_id() : ref_.address();
  }
  // Only the sender the coordinator chose (it holds the reservation's
  // secret) gets the transfer expected on its pair.
  absl::StatusOr<std::string> secret = engine_->ImportSecret(transfer_id);
  if (!secret.ok()) return FinishUnary(context, secret.status());
  if (!KvSecretsMatch(*secret, request->transfer_secret())) {
    return FinishUnary(context, absl::UnauthenticatedError(absl::StrCat(
                                    "PairKv: transfer ", request->transfer_id(),
                                    ": transfer_secret does not match the "
                                    "reservation's")));
  }
  absl::StatusOr<v1::NcclHandshake> handshake =
      options_.expect_nccl(*request, transfer_id, decode_id);
  if (!handshake.ok()) return FinishUnary(context, handshake.status());
  *response->mutable_nccl() = std::move(*handshake);
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerWriteReactor<v1::DecodeResponse>* WorkerService::Decode(
    grpc::CallbackServerContext* /*context*/,
    const v1::DecodeRequest* request) {
  const TsanHandlerScope handler(this);  // see common/tsan/annotations.h
  auto* reactor = new DecodeReactor();
  const std::string id = request->request_id();
  const SteadyClock::time_point arrival = SteadyClock::now();
  if (id.empty()) {
    const absl::Status invalid =
        absl::InvalidArgumentError("request_id: required");
    RecordEnd("decode", invalid);
    reactor->Close(ToGrpcStatus(invalid));
    return reactor;
  }
  reactor->SetOnCancel(CancelOnClientGone(id, "decode cancelled"));
  absl::Status landed;
  {
    absl::MutexLock lock(&mu_);
    absl::Status status = AttachDecodeLocked(*request, reactor, arrival);
    if (status.code() != absl::StatusCode::kAlreadyExists) {
      if (!status.ok()) {
        RecordEnd("decode", status);
        reactor->Close(ToGrpcStatus(status));
      }
      return reactor;
    }
    // kAlreadyExists: the import has landed; start outside the lock.
    auto it = imports_.find(id);
    landed = it->second.landed_status;
    imports_.erase(it);
    // Still leased (see OnLanded).
    if (landed.ok()) running_.insert(id);
  }
  if (!landed.ok()) {
    const absl::Status failed = absl::AbortedError(
        absl::StrCat("KV transfer failed: ", landed.message()));
    RecordEnd("decode", failed);
    reactor->Close(ToGrpcStatus(failed));
  } else {
    StartImportedDecode(*request, reactor, arrival);
  }
  return reactor;
}

absl::Status WorkerService::AttachDecodeLocked(
    const v1::DecodeRequest& request, DecodeReactor* reactor,
    SteadyClock::time_point arrival) {
  const std::string& id = request.request_id();
  if (auto local = locals_.find(id); local != locals_.end()) {
    LocalRequest& entry = *local->second;
    if (entry.decode != nullptr || entry.prefill != nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "request '", id,
          entry.decode != nullptr ? "' already has a Decode stream"
                                  : "' has not produced its first token"));
    }
    // The prefill stream carried the first token; a request that moved
    // here (a migration) generates again every token its client has, which
    // are skipped too.
    const int64_t skip =
        std::max<int64_t>(1, request.generated_token_ids_size());
    entry.decode = std::make_unique<DecodeStream>(
        reactor, skip, request.emitted_text_bytes(), 0.0);
    for (const RequestOutput& out : entry.buffered) entry.decode->Forward(out);
    entry.buffered.clear();
    if (entry.finished) locals_.erase(local);
    return absl::OkStatus();
  }
  auto it = imports_.find(id);
  if (it == imports_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "request '", id, "': no KV reservation or local request here"));
  }
  PendingImport& pending = it->second;
  if (!request.transfer_id().empty() &&
      request.transfer_id() != absl::StrCat(pending.transfer_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer_id: '", request.transfer_id(),
                     "' is not the reservation of request '", id, "'"));
  }
  if (pending.waiting != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("request '", id, "' already has a Decode stream"));
  }
  if (!pending.landed) {
    pending.waiting = reactor;
    pending.waiting_request = request;
    pending.waiting_since = arrival;
    return absl::OkStatus();
  }
  return absl::AlreadyExistsError("landed");
}

void WorkerService::StartImportedDecode(const v1::DecodeRequest& request,
                                        DecodeReactor* reactor,
                                        SteadyClock::time_point arrival) {
  auto params = FromProto(request.sampling());
  GenerationRequest generation;
  generation.id = request.request_id();
  generation.prompt.assign(request.prompt_token_ids().begin(),
                           request.prompt_token_ids().end());
  std::vector<int32_t> generated(request.generated_token_ids().begin(),
                                 request.generated_token_ids().end());
  absl::Status status = params.status();
  if (status.ok() && generated.empty()) {
    status = absl::InvalidArgumentError(
        "generated_token_ids: at least the prefill's first token is required");
  }
  if (!status.ok()) {
    {
      absl::MutexLock lock(&mu_);
      running_.erase(generation.id);
    }
    // The reservation must not outlive a Decode that cannot start.
    engine_->Cancel(generation.id);
    RecordEnd("decode", status);
    reactor->Close(ToGrpcStatus(status));
    return;
  }
  generation.params = std::move(*params);
  const std::string id = generation.id;
  {
    absl::MutexLock lock(&mu_);
    running_.insert(id);
  }
  auto stream = std::make_shared<DecodeStream>(reactor, /*skip_tokens=*/0,
                                               request.emitted_text_bytes(),
                                               MsSince(arrival));
  status = engine_->StartImportedDecode(
      std::move(generation), std::move(generated),
      [this, stream, id](const RequestOutput& out) {
        metrics_->OnDecodeTokens(static_cast<int64_t>(out.tokens.size()));
        if (out.finish_reason != FinishReason::kNone) {
          metrics_->OnRequestEnded(
              "decode", EndStatusLabel(out.finish_reason, out.error));
        }
        if (stream->Forward(out)) {
          absl::MutexLock lock(&mu_);
          running_.erase(id);
        }
      });
  if (!status.ok()) {
    {
      absl::MutexLock lock(&mu_);
      running_.erase(id);
    }
    engine_->Cancel(id);
    RecordEnd("decode", status);
    reactor->Close(ToGrpcStatus(status));
    return;
  }
  loop_->Wake();
}

}  // namespace baton

namespace baton {

std::vector<std::string> WorkerService::ExpireReservations(absl::Time now) {
  // Transfers that started (their first frame arrived) are bounded by the
  // receiver's stall timeout instead. Snapshot first: the two locks are
  // never held together.
  absl::flat_hash_set<uint64_t> started;
  {
    absl::MutexLock lock(&inbound_mu_);
    for (const auto& [transfer_id, inbound] : inbound_) {
      started.insert(transfer_id);
    }
  }
  std::vector<std::string> expired;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, pending] : imports_) {
      if (!pending.landed && now >= pending.expires &&
          !started.contains(pending.transfer_id)) {
        expired.push_back(id);
      }
    }
  }
  for (const std::string& id : expired) {
    CancelRequest(id, "KV reservation expired before its transfer started");
  }
  return expired;
}

}  // namespace baton
