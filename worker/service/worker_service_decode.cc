// The decode half of WorkerService: imports landing, Decode streams, and
// starting an imported sequence on the engine.
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/tsan/annotations.h"
#include "worker/service/proto_convert.h"
#include "worker/service/worker_service.h"
#include "worker/service/worker_service_internal.h"

namespace baton {

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
  }
  if (!status.ok()) {
    waiting->Close(ToGrpcStatus(absl::AbortedError(
        absl::StrCat("KV transfer failed: ", status.message()))));
    return;
  }
  StartImportedDecode(request, waiting, since);
}

grpc::ServerWriteReactor<v1::DecodeResponse>* WorkerService::Decode(
    grpc::CallbackServerContext* /*context*/,
    const v1::DecodeRequest* request) {
  BATON_TSAN_ACQUIRE(this);  // see common/tsan/annotations.h
  auto* reactor = new DecodeReactor();
  const std::string id = request->request_id();
  const SteadyClock::time_point arrival = SteadyClock::now();
  if (id.empty()) {
    reactor->Close(
        ToGrpcStatus(absl::InvalidArgumentError("request_id: required")));
    return reactor;
  }
  reactor->SetOnCancel([this, id] { CancelRequest(id, "decode cancelled"); });
  absl::Status landed;
  {
    absl::MutexLock lock(&mu_);
    absl::Status status = AttachDecodeLocked(*request, reactor, arrival);
    if (status.code() != absl::StatusCode::kAlreadyExists) {
      if (!status.ok()) reactor->Close(ToGrpcStatus(status));
      return reactor;
    }
    // kAlreadyExists: the import has landed; start outside the lock.
    auto it = imports_.find(id);
    landed = it->second.landed_status;
    imports_.erase(it);
  }
  if (!landed.ok()) {
    reactor->Close(ToGrpcStatus(absl::AbortedError(
        absl::StrCat("KV transfer failed: ", landed.message()))));
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
    // The prefill stream carried the first token.
    entry.decode = std::make_unique<DecodeStream>(
        reactor, /*skip_tokens=*/1, request.emitted_text_bytes(), 0.0);
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
    // The reservation must not outlive a Decode that cannot start.
    engine_->Cancel(generation.id);
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
    reactor->Close(ToGrpcStatus(status));
    return;
  }
  loop_->Wake();
}

}  // namespace baton
