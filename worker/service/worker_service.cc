#include "worker/service/worker_service.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "common/tsan/annotations.h"
#include "worker/engine/kv_sink.h"
#include "worker/service/proto_convert.h"
#include "worker/service/worker_service_internal.h"

namespace baton {

absl::StatusOr<std::unique_ptr<WorkerService>> WorkerService::Create(
    const WorkerServiceOptions& options, Engine* engine) {
  if (engine == nullptr) {
    return absl::InvalidArgumentError("WorkerService: engine is required");
  }
  if (options.role == v1::WORKER_ROLE_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        "WorkerService: role must be prefill, decode or both");
  }
  std::unique_ptr<WorkerService> service(new WorkerService(options, engine));
  if (options.role != v1::WORKER_ROLE_PREFILL) {
    auto receiver = TcpKvReceiver::Start(KvReceiverOptions(options),
                                         service->MeteredImportCallbacks());
    if (!receiver.ok()) return receiver.status();
    service->receiver_ = std::move(*receiver);
    service->reserve_queue_ =
        std::make_unique<ReservationQueue>(options.max_queued_reservations);
    if (options.start_device_receiver) {
      auto device_receiver = options.start_device_receiver(engine);
      if (!device_receiver.ok()) return device_receiver.status();
      service->device_receiver_ = std::move(*device_receiver);
    }
  }
  service->loop_ = std::make_unique<EngineLoop>(engine);
  WorkerService* self = service.get();
  service->scrape_hook_ =
      metrics::AddScrapeHook([self] { self->RefreshMetrics(); });
  BATON_TSAN_RELEASE(service.get());  // handed to gRPC's threads
  return service;
}

WorkerService::WorkerService(const WorkerServiceOptions& options,
                             Engine* engine)
    : options_(options),
      engine_(engine),
      metrics_(std::make_unique<WorkerMetrics>(
          options.metrics_registry != nullptr ? *options.metrics_registry
                                              : metrics::Registry(),
          WorkerRoleLabel(options.role))) {}

WorkerService::~WorkerService() {
  TsanAfterHandlers(this);  // see common/tsan/annotations.h
  // No reactor's on_cancel reaches the service from here on (the gRPC
  // server's shutdown cancels the streams still open, on its own threads).
  cancel_gate_->Close();
  // Its thread reserves through this service: it goes first.
  reserve_queue_.reset();
  scrape_hook_.reset();
  receiver_.reset();
  device_receiver_.reset();
  loop_.reset();
  // A handoff whose target follows its Prefill stops waiting for it (the
  // server's shutdown cancels its stream too, but only at its deadline).
  following_.Close(absl::UnavailableError("worker shutting down"));
  // Every Prefill and Decode stream still fed by the engine ends here, so
  // each reactor is closed (and freed) before the service goes.
  engine_->Shutdown(absl::UnavailableError("worker shutting down"));
  absl::MutexLock lock(&mu_);
  for (auto& [id, pending] : imports_) {
    if (pending.waiting != nullptr) {
      pending.waiting->Close(
          grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker shutting down"));
    }
  }
  imports_.clear();
}

std::function<void()> WorkerService::CancelOnClientGone(std::string id,
                                                        const char* reason) {
  return [this, gate = cancel_gate_, id = std::move(id), reason] {
    gate->Run([&] { CancelRequest(id, reason); });
  };
}

std::string WorkerService::kv_endpoint() const {
  return receiver_ == nullptr ? std::string() : receiver_->endpoint();
}

std::string WorkerService::device_kv_endpoint() const {
  return device_receiver_ == nullptr ? std::string()
                                     : device_receiver_->endpoint();
}

void WorkerService::SetWorkerRef(const std::string& worker_id,
                                 const std::string& address) {
  absl::MutexLock lock(&mu_);
  ref_.set_worker_id(worker_id);
  ref_.set_address(address);
}

v1::WorkerLoad WorkerService::Load() {
  const EngineStats stats = engine_->stats();
  v1::WorkerLoad load;
  load.set_queued_prefill_tokens(
      std::max<int64_t>(0, queued_prefill_tokens_.load()));
  load.set_running_sequences(static_cast<int32_t>(stats.num_running));
  load.set_waiting_requests(static_cast<int32_t>(stats.num_waiting));
  load.set_kv_blocks_free(stats.kv_blocks_free);
  load.set_kv_blocks_total(stats.kv_blocks_total);
  load.set_kv_blocks_cached(stats.kv_blocks_cached);
  load.set_kv_blocks_used(stats.kv_blocks_used);
  load.set_kv_blocks_reserved(stats.kv_blocks_reserved);
  load.set_engine_steps(stats.steps);
  load.set_prefill_tokens_per_second(stats.prefill_tokens_per_second);
  load.set_active_transfers(
      static_cast<int32_t>(stats.num_handoffs + stats.num_imports));
  load.set_queued_reservations(
      reserve_queue_ == nullptr ? 0
                                : static_cast<int32_t>(reserve_queue_->size()));
  return load;
}

std::vector<std::string> WorkerService::LeasedRequestIds(
    std::optional<std::string> owner) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> ids;
  for (const auto& [id, unused] : imports_) ids.push_back(id);
  for (const auto& [id, local] : locals_) {
    if (!local->finished) ids.push_back(id);
  }
  for (const std::string& id : running_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  // Owners of leases that ended go (a lease and its owner are added under
  // one lock, so no live lease loses its owner here).
  absl::erase_if(lease_owners_, [&](const auto& entry) {
    return !std::binary_search(ids.begin(), ids.end(), entry.first);
  });
  if (owner.has_value()) {
    std::erase_if(ids, [&](const std::string& id) {
      auto it = lease_owners_.find(id);
      return it != lease_owners_.end() && it->second != *owner;
    });
  }
  return ids;
}

grpc::ServerWriteReactor<v1::PrefillResponse>* WorkerService::Prefill(
    grpc::CallbackServerContext* /*context*/,
    const v1::PrefillRequest* request) {
  const TsanHandlerScope handler(this);  // see common/tsan/annotations.h
  auto* reactor = new PrefillReactor();
  absl::Status status = [&]() -> absl::Status {
    if (request->request_id().empty()) {
      return absl::InvalidArgumentError("request_id: required");
    }
    if (!options_.model_id.empty() && !request->model_id().empty() &&
        request->model_id() != options_.model_id) {
      return absl::InvalidArgumentError(
          absl::StrCat("model_id: '", request->model_id(),
                       "' is not served here ('", options_.model_id, "')"));
    }
    if (const int64_t waiting = engine_->stats().num_waiting;
        options_.max_waiting_requests > 0 &&
        waiting >= options_.max_waiting_requests) {
      return absl::ResourceExhaustedError(
          absl::StrCat("worker overloaded: ", waiting, " requests wait for ",
                       "its engine (--max_waiting_requests)"));
    }
    auto params = FromProto(request->sampling());
    if (!params.ok()) return params.status();
    GenerationRequest generation;
    generation.id = request->request_id();
    generation.prompt.assign(request->prompt_token_ids().begin(),
                             request->prompt_token_ids().end());
    generation.params = std::move(*params);
    generation.arrival_unix_us = request->arrival_unix_micros();
    if (request->has_kv_target()) {
      if (options_.role == v1::WORKER_ROLE_DECODE) {
        return absl::FailedPreconditionError(
            "Prefill: this worker has the decode role");
      }
      return StartSplitPrefill(*request, std::move(generation), reactor);
    }
    // Served here from prompt to end: a `both` worker, or a decode worker
    // whose prefix cache holds most of the prompt (the coordinator's
    // local_prefill_tokens).
    if (options_.role == v1::WORKER_ROLE_PREFILL) {
      return absl::InvalidArgumentError(
          "kv_target: required on a worker whose role is prefill");
    }
    return StartLocalRequest(std::move(generation), request->coordinator_id(),
                             reactor);
  }();
  if (!status.ok()) {
    RecordEnd("prefill", status);
    reactor->Close(ToGrpcStatus(status));
  } else {
    loop_->Wake();
  }
  return reactor;
}

absl::Status WorkerService::StartSplitPrefill(const v1::PrefillRequest& request,
                                              GenerationRequest generation,
                                              PrefillReactor* reactor) {
  const std::string id = generation.id;
  PrefillOptions prefill_options;
  v1::KvTransport chosen = v1::KV_TRANSPORT_HOST_TCP;
  if (request.kv_target_follows()) {
    // The target comes later (SetKvTarget); the handoff waits for it.
    BATON_RETURN_IF_ERROR(following_.Expect(id));
    prefill_options.make_sink = FollowingKvSink(id);
  } else {
    BATON_RETURN_IF_ERROR(ChooseKvSink(request, &prefill_options, &chosen));
  }
  const int64_t prompt_tokens = static_cast<int64_t>(generation.prompt.size());
  const int num_layers = static_cast<int>(engine_->config().num_layers);
  const SteadyClock::time_point arrival = SteadyClock::now();
  prefill_options.timeout = options_.handoff_timeout;
  {
    absl::MutexLock lock(&mu_);
    running_.insert(id);
    TagLeaseLocked(id, request.coordinator_id());
  }
  reactor->SetOnCancel(CancelOnClientGone(id, "prefill cancelled"));
  queued_prefill_tokens_ += prompt_tokens;
  // Engine thread only: the prompt has been prefilled.
  auto prefilled = std::make_shared<bool>(false);
  absl::Status status = engine_->SubmitPrefill(
      std::move(generation), std::move(prefill_options),
      [this, reactor, id, num_layers, arrival, prompt_tokens, prefilled,
       chosen](const PrefillOutput& out) {
        if (!out.done) {
          if (!out.first_token.has_value()) return;
          if (!*prefilled) {
            *prefilled = true;
            queued_prefill_tokens_ -= prompt_tokens;
            metrics_->OnPrefilled(prompt_tokens);
          }
          v1::PrefillResponse response;
          v1::PrefillFirstToken* first = response.mutable_first_token();
          first->set_token_id(out.first_token->token);
          if (out.first_token->logprob.has_value() ||
              !out.first_token->processed.empty()) {
            *first->mutable_logprobs() = ToProto(*out.first_token);
          }
          first->set_prefill_ms(MsSince(arrival));
          first->set_cached_prompt_tokens(
              static_cast<int32_t>(out.metrics.cached_tokens));
          reactor->Push(std::move(response));
          return;
        }
        {
          absl::MutexLock lock(&mu_);
          running_.erase(id);
        }
        // A sink still waiting for its target gives up.
        following_.End(id, absl::CancelledError("the prefill ended"));
        if (!*prefilled) queued_prefill_tokens_ -= prompt_tokens;
        if (out.finish_reason != FinishReason::kNone) {
          metrics_->OnRequestEnded(
              "prefill", EndStatusLabel(out.finish_reason, out.error));
          reactor->Close(ToGrpcStatus(
              StatusOfEnd(out.finish_reason, out.error, "prefill")));
          return;
        }
        v1::PrefillResponse response;
        v1::PrefillHandoff* handoff = response.mutable_handoff();
        handoff->set_kv_transfer_bytes(
            static_cast<int64_t>(out.handoff.kv_bytes));
        handoff->set_kv_transfer_ms(out.handoff.transfer_s * 1e3);
        handoff->set_kv_transfer_exposed_ms(out.handoff.tail_s * 1e3);
        handoff->set_layers_sent(num_layers);
        handoff->set_kv_transport(chosen);
        metrics_->OnKvSent(out.handoff.kv_bytes, out.handoff.transfer_s);
        metrics_->OnRequestEnded("prefill", "ok");
        reactor->Push(std::move(response));
        reactor->Close(grpc::Status::OK);
      });
  if (!status.ok()) {
    following_.End(id, status);
    queued_prefill_tokens_ -= prompt_tokens;
    absl::MutexLock lock(&mu_);
    running_.erase(id);
  }
  return status;
}

absl::Status WorkerService::StartLocalRequest(GenerationRequest generation,
                                              const std::string& owner,
                                              PrefillReactor* reactor) {
  auto local = std::make_shared<LocalRequest>();
  local->id = generation.id;
  local->prompt_tokens = static_cast<int64_t>(generation.prompt.size());
  local->prefill = reactor;
  local->arrival = SteadyClock::now();
  {
    absl::MutexLock lock(&mu_);
    if (locals_.contains(local->id) || imports_.contains(local->id)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request_id: '", local->id, "' is already in use on this worker"));
    }
    locals_[local->id] = local;
    TagLeaseLocked(local->id, owner);
  }
  const std::string id = local->id;
  reactor->SetOnCancel(CancelOnClientGone(id, "prefill cancelled"));
  queued_prefill_tokens_ += local->prompt_tokens;
  absl::Status status = engine_->Submit(
      std::move(generation),
      [this, local](const RequestOutput& out) { OnLocalOutput(local, out); });
  if (!status.ok()) {
    queued_prefill_tokens_ -= local->prompt_tokens;
    absl::MutexLock lock(&mu_);
    locals_.erase(id);
  }
  return status;
}

void WorkerService::OnLocalOutput(const std::shared_ptr<LocalRequest>& local,
                                  const RequestOutput& out) {
  const bool final = out.finish_reason != FinishReason::kNone;
  absl::MutexLock lock(&mu_);
  if (local->prefill == nullptr) {
    metrics_->OnDecodeTokens(static_cast<int64_t>(out.tokens.size()));
  } else if (!out.tokens.empty() || final) {
    queued_prefill_tokens_ -= local->prompt_tokens;
  }
  if (local->prefill != nullptr) {
    if (!out.tokens.empty()) {
      metrics_->OnPrefilled(local->prompt_tokens);
      metrics_->OnRequestEnded("prefill", "ok");
      metrics_->OnDecodeTokens(static_cast<int64_t>(out.tokens.size()) - 1);
      v1::PrefillResponse first;
      v1::PrefillFirstToken* token = first.mutable_first_token();
      token->set_token_id(out.tokens[0].token);
      if (out.tokens[0].logprob.has_value() ||
          !out.tokens[0].processed.empty()) {
        *token->mutable_logprobs() = ToProto(out.tokens[0]);
      }
      token->set_prefill_ms(MsSince(local->arrival));
      token->set_cached_prompt_tokens(
          static_cast<int32_t>(out.metrics.cached_tokens));
      local->prefill->Push(std::move(first));
      v1::PrefillResponse handoff;
      handoff.mutable_handoff();  // the cache stays here: nothing moved
      local->prefill->Push(std::move(handoff));
      local->prefill->Close(grpc::Status::OK);
      local->prefill = nullptr;
    } else if (final) {
      // Ended before its first token: nothing for a Decode to continue.
      metrics_->OnRequestEnded("prefill",
                               EndStatusLabel(out.finish_reason, out.error));
      local->prefill->Close(
          ToGrpcStatus(StatusOfEnd(out.finish_reason, out.error, "request")));
      local->prefill = nullptr;
      locals_.erase(local->id);
      return;
    }
  }
  if (final) {
    metrics_->OnRequestEnded("decode",
                             EndStatusLabel(out.finish_reason, out.error));
  }
  if (local->decode != nullptr) {
    local->decode->Forward(out);
  } else {
    local->buffered.push_back(out);
  }
  if (final) {
    local->finished = true;
    if (local->decode != nullptr || local->cancelled) locals_.erase(local->id);
  }
}

bool WorkerService::CancelRequest(const std::string& request_id,
                                  const std::string& /*reason*/) {
  following_.End(request_id, absl::CancelledError("request cancelled"));
  engine_->Cancel(request_id);
  DecodeReactor* waiting = nullptr;
  bool found = false;
  {
    absl::MutexLock lock(&mu_);
    found = running_.contains(request_id);
    if (auto it = imports_.find(request_id); it != imports_.end()) {
      found = true;
      waiting = it->second.waiting;
      imports_.erase(it);
    }
    if (auto it = locals_.find(request_id); it != locals_.end()) {
      found = true;
      it->second->cancelled = true;
      if (it->second->finished) locals_.erase(it);
    }
  }
  if (waiting != nullptr) {
    RecordEnd("decode", absl::CancelledError("request cancelled"));
    waiting->Close(grpc::Status(grpc::StatusCode::CANCELLED,
                                "request cancelled on the worker"));
  }
  loop_->Wake();
  return found;
}

grpc::ServerUnaryReactor* WorkerService::Cancel(
    grpc::CallbackServerContext* context, const v1::CancelRequest* request,
    v1::CancelResponse* response) {
  const TsanHandlerScope handler(this);  // see common/tsan/annotations.h
  const int64_t free_before = engine_->stats().kv_blocks_free;
  response->set_found(CancelRequest(request->request_id(), request->reason()));
  response->set_blocks_freed(
      std::max<int64_t>(0, engine_->stats().kv_blocks_free - free_before));
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* WorkerService::GetWorkerStatus(
    grpc::CallbackServerContext* context,
    const v1::GetWorkerStatusRequest* /*request*/,
    v1::GetWorkerStatusResponse* response) {
  const TsanHandlerScope handler(this);  // see common/tsan/annotations.h
  *response->mutable_load() = Load();
  for (std::string& id : LeasedRequestIds()) {
    response->add_leased_request_ids(std::move(id));
  }
  {
    absl::MutexLock lock(&mu_);
    *response->mutable_worker() = ref_;
  }
  response->set_role(options_.role);
  return FinishUnary(context, absl::OkStatus());
}

}  // namespace baton
