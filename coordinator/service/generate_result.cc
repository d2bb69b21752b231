// GenerateCall's replies to the client: the first token, the final
// result with its timings and placement, and the request's metrics.
#include <string>
#include <utility>

#include "coordinator/service/generate_call.h"
#include "coordinator/service/generate_call_internal.h"
#include "model/tokenizer/incremental_decoder.h"
#include "proto/convert.h"
#include "worker/sampler/sampling_params.h"
#include "worker/sampler/stop_checker.h"

namespace baton::coordinator {

void GenerateCall::SendFirstToken(const v1::PrefillFirstToken& first) {
  // The first token's text, as the decode worker will compute it, so the
  // client gets text at once; the decode worker skips these bytes.
  const Tokenizer& tokenizer = cluster_->model().tokenizer();
  auto params = FromProto(job_.sampling);
  std::string text;
  if (params.ok() &&
      !IsStopToken(*params, first.token_id(),
                   tokenizer.end_of_generation_ids()) &&
      tokenizer.IsValidId(first.token_id())) {
    IncrementalDecoder decoder(tokenizer, /*skip_special=*/true);
    StopChecker stops(params->stop);
    text = stops.Push(decoder.Push(first.token_id())).emit;
  }
  emitted_text_bytes_ = static_cast<int64_t>(text.size());
  v1::GenerateResponse out;
  out.set_request_id(job_.client_id);
  out.add_token_ids(first.token_id());
  out.set_text(std::move(text));
  if (first.has_logprobs()) *out.add_logprobs() = first.logprobs();
  completion_tokens_ = 1;
  generated_.assign(1, first.token_id());
  first_token_time_ = last_token_time_ = SteadyClock::now();
  ttft_ms_ = MsBetween(arrival_, first_token_time_);
  streamed_ = true;
  LeaveWaiting();
  CoordinatorMetrics& metrics = cluster_->metrics();
  metrics.OnFirstToken(ttft_ms_ / 1e3,
                       static_cast<int64_t>(job_.prompt.size()));
  metrics.OnTokens(1);
  reactor_->Push(std::move(out));
}

v1::GenerateResult GenerateCall::BaseResult() const {
  v1::GenerateResult result;
  result.mutable_usage()->set_prompt_tokens(
      static_cast<int32_t>(job_.prompt.size()));
  result.mutable_usage()->set_completion_tokens(completion_tokens_);
  result.mutable_usage()->set_cached_tokens(cached_tokens_);
  v1::PhaseTimings* t = result.mutable_timings();
  t->set_queue_ms(queue_ms_);
  t->set_reserve_kv_ms(reserve_kv_ms_);
  t->set_reserve_kv_beside_prefill(reserved_beside_prefill_);
  t->set_prefill_ms(prefill_ms_);
  t->set_kv_transfer_bytes(handoff_.kv_transfer_bytes());
  t->set_kv_transfer_ms(handoff_.kv_transfer_ms());
  t->set_kv_transfer_exposed_ms(handoff_.kv_transfer_exposed_ms());
  if (decode_.has_value()) {
    t->set_kv_transfer_cached_tokens(
        reservation_.cached_blocks() *
        decode_->registration.kv_layout.block_size);
  }
  t->set_ttft_ms(ttft_ms_);
  if (completion_tokens_ > 1) {
    const double s = MsBetween(first_token_time_, last_token_time_) / 1e3;
    if (s > 0) t->set_decode_tokens_per_s((completion_tokens_ - 1) / s);
  }
  t->set_total_ms(MsBetween(arrival_, SteadyClock::now()));
  if (prefill_.has_value()) {
    *result.mutable_prefill_worker() = ToRef(*prefill_);
    *result.mutable_decode_worker() =
        ToRef(decode_.has_value() ? *decode_ : *prefill_);
    // As the prefill worker reports it (older workers: HOST_TCP).
    result.set_kv_transport(!decode_.has_value() ? v1::KV_TRANSPORT_LOCAL
                            : handoff_.kv_transport() !=
                                    v1::KV_TRANSPORT_UNSPECIFIED
                                ? handoff_.kv_transport()
                                : v1::KV_TRANSPORT_HOST_TCP);
  }
  result.set_seed(job_.sampling.seed());
  result.set_migrations(migrations_);
  result.set_retries(retries_);
  return result;
}

void GenerateCall::SendResult(const v1::DecodeResult& decoded) {
  v1::GenerateResponse out;
  out.set_request_id(job_.client_id);
  v1::GenerateResult* result = out.mutable_result();
  *result = BaseResult();
  result->set_finish_reason(decoded.finish_reason());
  if (decoded.has_stop_token_id()) {
    result->set_stop_token_id(decoded.stop_token_id());
  } else if (decoded.has_stop_string()) {
    result->set_stop_string(decoded.stop_string());
  }
  reactor_->Push(std::move(out));
  RecordEnd(absl::OkStatus(), decoded.finish_reason());
  reactor_->Close(grpc::Status::OK);
  reactor_ = nullptr;
}

void GenerateCall::LeaveWaiting() {
  if (!waiting_) return;
  waiting_ = false;
  cluster_->EndWaiting();
}

void GenerateCall::RecordEnd(const absl::Status& status,
                             v1::FinishReason reason) {
  if (end_recorded_) return;
  end_recorded_ = true;
  LeaveWaiting();
  FinishedRequest finished;
  finished.status = RequestStatusLabel(status, reason);
  finished.e2e_s = MsBetween(arrival_, SteadyClock::now()) / 1e3;
  if (prefill_started_) finished.queue_s = queue_ms_ / 1e3;
  finished.completion_tokens = completion_tokens_;
  if (completion_tokens_ > 0) {
    finished.first_to_last_token_s =
        MsBetween(first_token_time_, last_token_time_) / 1e3;
  }
  cluster_->metrics().OnRequestFinished(finished, &inter_token_);
}

}  // namespace baton::coordinator
