#include "coordinator/service/generate_call.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <random>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc/async_call.h"
#include "common/grpc/grpc_status.h"
#include "common/status_macros.h"
#include "coordinator/service/generate_call_internal.h"
#include "proto/convert.h"
#include "worker/sampler/sampling_params.h"

namespace baton::coordinator {
namespace {

using PrefillReader =
    async::StreamReader<v1::PrefillRequest, v1::PrefillResponse>;
using DecodeReader = async::StreamReader<v1::DecodeRequest, v1::DecodeResponse>;

// A seed for a request that gave none: from a per-thread generator seeded
// once from the system's entropy (opening the random device per request
// costs more than the rest of the request's routing).
uint64_t DrawSeed() {
  thread_local std::mt19937_64 generator = [] {
    std::random_device device;
    std::seed_seq seeds{device(), device(), device(), device()};
    return std::mt19937_64(seeds);
  }();
  return generator();
}

// Unique among the replicas serving one cluster: their ids differ.
std::string NewRequestId(const std::string& coordinator_id) {
  static std::atomic<uint64_t> counter{0};
  return absl::StrCat("req-", coordinator_id, "-", counter.fetch_add(1));
}

}  // namespace

absl::StatusOr<GenerateJob> PrepareGenerate(const ServedModel& model,
                                            const ClusterOptions& options,
                                            const v1::GenerateRequest& request,
                                            absl::Time deadline) {
  const RequestLimits& limits = options.limits;
  BATON_RETURN_IF_ERROR(CheckRequestLimits(limits, request));
  if (!request.model().empty() && request.model() != model.id()) {
    return absl::NotFoundError(absl::StrCat("model: '", request.model(),
                                            "' is not served here (served: '",
                                            model.id(), "')"));
  }
  GenerateJob job;
  auto prompt = model.EncodePrompt(request);
  if (!prompt.ok()) return prompt.status();
  BATON_RETURN_IF_ERROR(
      CheckPromptTokens(limits, static_cast<int64_t>(prompt->size())));
  job.prompt = std::move(*prompt);
  job.sampling = request.sampling();
  if (!job.sampling.has_seed()) job.sampling.set_seed(DrawSeed());
  auto params = FromProto(job.sampling);
  if (!params.ok()) {
    const std::string message(params.status().message());
    return absl::InvalidArgumentError(absl::StartsWith(message, "sampling.")
                                          ? message
                                          : absl::StrCat("sampling.", message));
  }
  for (int32_t id : params->stop_token_ids) {
    if (!model.tokenizer().IsValidId(id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.stop_token_ids: ", id, " is outside [0, ",
                       model.tokenizer().vocab_size(), ")"));
    }
  }
  if (absl::Status s =
          Validate(*params, static_cast<int64_t>(job.prompt.size()),
                   model.config().context_length);
      !s.ok()) {
    return s;
  }
  job.sampling.set_max_tokens(static_cast<int32_t>(params->max_tokens));
  job.client_id = request.request_id();
  const std::string id = NewRequestId(options.coordinator_id);
  job.internal_id =
      job.client_id.empty() ? id : absl::StrCat(job.client_id, "@", id);
  if (job.client_id.empty()) job.client_id = job.internal_id;
  job.deadline = deadline;
  return job;
}

void GenerateCall::Start(Cluster* cluster, GenerateJob job,
                         GenerateReactor* reactor) {
  auto call = std::make_shared<GenerateCall>(cluster, std::move(job), reactor);
  cluster->metrics().OnRequestStarted();
  cluster->AddCall(call->job_.internal_id, call);
  std::weak_ptr<GenerateCall> weak = call;
  reactor->SetOnCancel([weak] {
    if (auto call = weak.lock()) {
      call->Abort("",
                  absl::Now() >= call->job_.deadline
                      ? absl::DeadlineExceededError("request deadline expired")
                      : absl::CancelledError("cancelled by the client"));
    }
  });
  cluster->executor().Post([call = std::move(call)]() mutable {
    GenerateCall* c = call.get();
    c->Run(std::move(call));
  });
}

GenerateCall::GenerateCall(Cluster* cluster, GenerateJob job,
                           GenerateReactor* reactor)
    : cluster_(cluster),
      job_(std::move(job)),
      reactor_(reactor),
      arrival_(SteadyClock::now()),
      inter_token_(cluster->metrics().NewInterTokenAccumulator()),
      attempt_id_(job_.internal_id) {}

GenerateCall::~GenerateCall() {
  LeaveWaiting();
  cluster_->EndRunning();
}

void GenerateCall::Abort(absl::string_view attempt_id,
                         const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (!abort_.ok()) return;
  if (!attempt_id.empty()) {
    // The state machine ended that attempt; Run asks it what comes next. A
    // past attempt is not this call's concern any more.
    if (attempt_id != attempt_id_ || !attempt_abort_.ok()) return;
    attempt_abort_ =
        status.ok() ? absl::CancelledError("attempt ended") : status;
  } else {
    abort_ = status.ok() ? absl::CancelledError("aborted") : status;
  }
  for (grpc::ClientContext* context : contexts_) context->TryCancel();
  if (backoff_timer_ != 0) cluster_->executor().Fire(backoff_timer_);
}

absl::Status GenerateCall::aborted() const {
  absl::MutexLock lock(&mu_);
  return !abort_.ok() ? abort_ : attempt_abort_;
}

absl::Status GenerateCall::request_aborted() const {
  absl::MutexLock lock(&mu_);
  return abort_;
}

GenerateCall::BackoffAwaiter GenerateCall::Backoff(absl::Duration d) {
  return BackoffAwaiter(this, d);
}

void GenerateCall::SetDeadline(grpc::ClientContext* context) const {
  if (job_.deadline != absl::InfiniteFuture()) {
    context->set_deadline(absl::ToChronoTime(job_.deadline));
  }
}

async::Detach GenerateCall::Run(std::shared_ptr<GenerateCall> self) {
  RequestStateMachine& requests = cluster_->requests();
  RequestSpec spec;
  spec.prompt_tokens = static_cast<int64_t>(job_.prompt.size());
  spec.max_tokens = job_.sampling.max_tokens();
  spec.deadline = job_.deadline;
  absl::Status status = requests.Admit(job_.internal_id, spec);
  const bool admitted = status.ok();
  bool again = admitted;
  while (again) {
    BeginAttempt();
    status = co_await Route();
    if (status.ok()) status = co_await Serve();
    if (overlap_in_flight_ != nullptr) {
      // Serve ended before its reservation beside the Prefill did (and
      // cancelled it): its end comes first.
      co_await OverlapAwaiter(overlap_in_flight_.get());
      overlap_in_flight_.reset();
    }
    again = !status.ok() && EndAttempt(&status);
  }
  if (!status.ok()) Fail(std::move(status));
  // Every path above ends the record; a live one here is a bug, and must
  // not leave blocks held.
  if (admitted) {
    if (auto snapshot = requests.Get(job_.internal_id);
        snapshot.ok() && !IsTerminal(snapshot->state)) {
      auto cancelled = requests.Cancel(job_.internal_id, "the call ended");
      if (cancelled.ok()) cluster_->PerformCleanup(*cancelled);
    }
    requests.Forget(job_.internal_id).IgnoreError();
  }
  if (!end_recorded_) {
    // Every path ends in SendResult or Fail; this keeps
    // baton_requests_active exact if one ever does not.
    RecordEnd(
        status.ok() ? absl::InternalError("request ended unseen") : status,
        v1::FINISH_REASON_UNSPECIFIED);
  }
  cluster_->RemoveCall(job_.internal_id);
  // The last reference may go with this frame: nothing after it.
  static_cast<void>(self);
}

void GenerateCall::BeginAttempt() {
  auto snapshot = cluster_->requests().Get(job_.internal_id);
  if (snapshot.ok()) {
    attempt_ = snapshot->attempt_id;
    excluded_prefill_ = snapshot->excluded_prefill;
    excluded_decode_ = snapshot->excluded_decode;
    queue_deadline_ = snapshot->queue_deadline;
    migrations_ = snapshot->migrations;
    retries_ = snapshot->attempt - 1 - snapshot->migrations;
  }
  prefill_.reset();
  decode_.reset();
  reservation_.Clear();
  overlap_request_.reset();
  absl::MutexLock lock(&mu_);
  attempt_id_ = attempt_;
  attempt_abort_ = absl::OkStatus();
}

bool GenerateCall::EndAttempt(absl::Status* status) {
  RequestStateMachine& requests = cluster_->requests();
  // The request's own abort (client, deadline, shutdown) is final and the
  // real reason: RPC errors after it are only its echo (CANCELLED).
  if (absl::Status s = request_aborted(); !s.ok()) *status = s;
  absl::StatusOr<Transition> t = requests.OnAttemptFailed(attempt_, *status);
  if (t.ok()) {
    cluster_->PerformCleanup(*t);
    if (t->new_attempt) return true;
    *status = t->status;
    return false;
  }
  // The sweeper ended the attempt first (a worker went DOWN, a timer).
  absl::StatusOr<RequestSnapshot> snapshot = requests.Get(job_.internal_id);
  if (!snapshot.ok()) return false;
  if (IsTerminal(snapshot->state)) {
    if (!snapshot->status.ok()) *status = snapshot->status;
    return false;
  }
  if (snapshot->attempt_id != attempt_) return true;
  *status = absl::InternalError(
      absl::StrCat("request ", job_.internal_id, ": ", t.status().message()));
  return false;
}

async::Task<absl::Status> GenerateCall::Serve() {
  // Route started the prefill in the state machine (PREFILLING).
  RequestStateMachine& requests = cluster_->requests();
  const std::string& id = attempt_;
  async::Executor* const executor = &cluster_->executor();
  auto prefill = std::make_shared<PrefillReader>(executor);
  v1::PrefillRequest& prefill_request = *prefill->request();
  prefill_request.set_request_id(id);
  prefill_request.set_model_id(cluster_->model().id());
  prefill_request.set_coordinator_id(cluster_->options().coordinator_id);
  // Every attempt carries the request's own arrival: the worker admits
  // prompts in that order (a retry goes ahead of later arrivals).
  prefill_request.set_arrival_unix_micros(absl::ToUnixMicros(job_.arrival));
  prefill_request.mutable_prompt_token_ids()->Add(job_.prompt.begin(),
                                                  job_.prompt.end());
  *prefill_request.mutable_sampling() = job_.sampling;
  // A reservation still to make goes beside the Prefill, whose target
  // follows it.
  std::shared_ptr<Overlap> overlap;
  if (decode_.has_value() && overlap_request_.has_value()) {
    *prefill_request.mutable_kv_target()->mutable_decode_worker() =
        ToRef(*decode_);
    prefill_request.set_kv_target_follows(true);
    overlap = std::make_shared<Overlap>();
    overlap->request = std::move(*overlap_request_);
    overlap_request_.reset();
  } else if (decode_.has_value()) {
    FillKvTarget(*decode_, reservation_, prefill_request.mutable_kv_target());
  }
  // However this attempt's serving ends, its reservation's calls end too.
  struct CancelOnExit {
    std::shared_ptr<Overlap>* overlap;
    ~CancelOnExit() {
      if (*overlap != nullptr) (*overlap)->Cancel();
    }
  } cancel_overlap{&overlap};
  SetDeadline(prefill->context());
  ScopedContext prefill_scope(this, prefill->context());
  if (!streamed_) queue_ms_ = MsBetween(arrival_, SteadyClock::now());
  prefill_started_ = true;
  cluster_->WorkerStub(prefill_->registration.address)
      ->async()
      ->Prefill(prefill->context(), prefill->request(), prefill.get());
  prefill->Start();
  if (overlap != nullptr) {
    overlap_in_flight_ = overlap;
    ReserveBesidePrefill(shared_from_this(), overlap, id, *decode_, *prefill_);
  }
  async::AbandonOnExit prefill_guard(prefill.get());
  v1::PrefillResponse message;
  bool got = co_await prefill->Read(&message);
  if (!got || !message.has_first_token()) {
    prefill_guard.Release();
    grpc::Status rpc;
    if (got) {
      prefill->Abandon();
    } else {
      rpc = co_await prefill->Finish();
    }
    if (absl::Status s = aborted(); !s.ok()) co_return s;
    if (rpc.ok()) {
      co_return absl::InternalError(absl::StrCat(
          "Prefill on worker ", prefill_->ref.id, " sent no first token"));
    }
    co_return WorkerError(*prefill_, WorkerRpc::kPrefill, rpc);
  }
  auto first = requests.OnFirstToken(id);
  if (!first.ok()) co_return first.status();
  const bool resuming = !generated_.empty();
  if (!resuming) {
    prefill_ms_ = message.first_token().prefill_ms();
    cached_tokens_ = message.first_token().cached_prompt_tokens();
    SendFirstToken(message.first_token());
  } else if (message.first_token().token_id() != generated_.front()) {
    // A migration continues the stream only where the new workers compute
    // what the old ones did.
    co_return absl::InternalError(absl::StrCat(
        "migration: prefill worker ", prefill_->ref.id, " sampled token ",
        message.first_token().token_id(), " where the client got ",
        generated_.front(), " (workers on different kernel paths?)"));
  }

  if (overlap != nullptr) {
    // The Decode names the reservation: wait for it (the first token is
    // out already).
    co_await OverlapAwaiter(overlap.get());
    overlap_in_flight_.reset();
    if (absl::Status s = aborted(); !s.ok()) co_return s;
    if (!overlap->status.ok()) co_return overlap->status;
    reservation_ = overlap->reserved;
    reserved_beside_prefill_ = true;
    if (!resuming) reserve_kv_ms_ = overlap->reserve_ms;
    // Its two calls' memory goes now, not when the stream ends.
    overlap.reset();
  }

  // Decode starts now; the decode worker waits for the KV to land.
  const WorkerInfo& decoder = decode_.has_value() ? *decode_ : *prefill_;
  auto decode = std::make_shared<DecodeReader>(executor);
  v1::DecodeRequest& decode_request = *decode->request();
  decode_request.set_request_id(id);
  if (decode_.has_value()) {
    decode_request.set_transfer_id(reservation_.transfer_id());
  }
  decode_request.mutable_prompt_token_ids()->Add(job_.prompt.begin(),
                                                 job_.prompt.end());
  *decode_request.mutable_sampling() = job_.sampling;
  decode_request.mutable_generated_token_ids()->Add(generated_.begin(),
                                                    generated_.end());
  decode_request.set_emitted_text_bytes(emitted_text_bytes_);
  SetDeadline(decode->context());
  ScopedContext decode_scope(this, decode->context());
  cluster_->WorkerStub(decoder.registration.address)
      ->async()
      ->Decode(decode->context(), decode->request(), decode.get());
  decode->Start();
  async::AbandonOnExit decode_guard(decode.get());

  // Both loops below forward what they read without blocking: they resume
  // on gRPC's thread (ReadInline), not through the executor.
  while (co_await prefill->ReadInline(&message)) {
    if (message.has_handoff()) handoff_ = message.handoff();
  }
  prefill_guard.Release();
  const grpc::Status prefill_status = co_await prefill->Finish();
  if (absl::Status s = aborted(); !s.ok()) co_return s;
  if (!prefill_status.ok()) {
    co_return WorkerError(*prefill_, WorkerRpc::kPrefillHandoff,
                          prefill_status);
  }
  if (decode_.has_value()) {
    auto handed_off = requests.OnHandoff(id);
    if (!handed_off.ok()) co_return handed_off.status();
  }

  v1::DecodeResponse response;
  v1::DecodeResult result;
  bool have_result = false;
  while (co_await decode->ReadInline(&response)) {
    if (response.token_ids_size() > 0 || !response.text().empty()) {
      v1::GenerateResponse out;
      out.mutable_token_ids()->CopyFrom(response.token_ids());
      out.set_text(response.text());
      out.mutable_logprobs()->CopyFrom(response.logprobs());
      const SteadyClock::time_point now = SteadyClock::now();
      if (now - activity_reported_ >= std::chrono::milliseconds(100)) {
        // Data from the worker: a sign of life while its heartbeats are
        // late (it then stays SUSPECT rather than going DOWN).
        cluster_->registry().RecordActivity(decoder.ref);
        activity_reported_ = now;
      }
      if (const int k = response.token_ids_size(); k > 0) {
        inter_token_.Add(MsBetween(last_token_time_, now) / 1e3 / k, k);
        cluster_->metrics().OnTokens(k);
      }
      completion_tokens_ += response.token_ids_size();
      generated_.insert(generated_.end(), response.token_ids().begin(),
                        response.token_ids().end());
      emitted_text_bytes_ += static_cast<int64_t>(response.text().size());
      last_token_time_ = now;
      reactor_->Push(std::move(out));
    }
    if (response.has_result()) {
      result = response.result();
      have_result = true;
    }
  }
  decode_guard.Release();
  const grpc::Status decode_status = co_await decode->Finish();
  if (absl::Status s = aborted(); !s.ok()) co_return s;
  if (!decode_status.ok()) {
    co_return WorkerError(decoder, WorkerRpc::kDecode, decode_status);
  }
  if (!have_result) {
    co_return absl::InternalError(absl::StrCat(
        "Decode on worker ", decoder.ref.id, " ended without a result"));
  }
  if (result.finish_reason() == v1::FINISH_REASON_ERROR) {
    co_return WorkerError(
        decoder, WorkerRpc::kDecode,
        grpc::Status(static_cast<grpc::StatusCode>(result.error_code()),
                     result.error_message()));
  }
  if (result.finish_reason() == v1::FINISH_REASON_CANCELLED) {
    // Not asked for (an abort returned above): the worker dropped the
    // request on its own (e.g. it took this coordinator for gone).
    co_return WorkerError(decoder, WorkerRpc::kDecode,
                          grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                       "the worker cancelled the request"));
  }
  auto finished = requests.OnFinished(id);
  if (!finished.ok()) co_return finished.status();
  SendResult(result);
  co_return absl::OkStatus();
}

void GenerateCall::Fail(absl::Status why) {
  {
    absl::MutexLock lock(&mu_);
    if (abort_.ok()) abort_ = why;
  }
  RecordEnd(why, v1::FINISH_REASON_UNSPECIFIED);
  if (reactor_ == nullptr) return;
  // The request's own deadline ends the call with DEADLINE_EXCEEDED even
  // after tokens were streamed: the client's gRPC deadline fires at the same
  // moment, and whichever side got there first, the client sees one answer.
  const bool own_deadline =
      absl::IsDeadlineExceeded(why) && absl::Now() >= job_.deadline;
  if (!streamed_ || own_deadline) {
    reactor_->Close(ToGrpcStatus(why));
  } else {
    v1::GenerateResponse out;
    out.set_request_id(job_.client_id);
    v1::GenerateResult* result = out.mutable_result();
    *result = BaseResult();
    // Tokens already streamed end as cancelled when the coordinator stops
    // (as a client cancel would), not as an error.
    const bool shutdown = why.GetPayload(kShutdownPayload).has_value();
    const absl::StatusCode code =
        shutdown ? absl::StatusCode::kCancelled : why.code();
    result->set_finish_reason(code == absl::StatusCode::kCancelled
                                  ? v1::FINISH_REASON_CANCELLED
                                  : v1::FINISH_REASON_ERROR);
    result->set_error_code(static_cast<int32_t>(code));
    result->set_error_message(std::string(why.message()));
    reactor_->Push(std::move(out));
    reactor_->Close(grpc::Status::OK);
  }
  reactor_ = nullptr;
}

}  // namespace baton::coordinator
