// Pieces shared by the WorkerService's translation units: the stream that
// forwards one engine output stream to a Decode RPC, a colocated request's
// state, and small status helpers. Internal to worker/service.
#ifndef BATON_WORKER_SERVICE_WORKER_SERVICE_INTERNAL_H_
#define BATON_WORKER_SERVICE_WORKER_SERVICE_INTERNAL_H_

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "worker/service/proto_convert.h"
#include "worker/service/worker_service.h"

namespace baton {

using SteadyClock = std::chrono::steady_clock;

inline double MsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double, std::milli>(SteadyClock::now() - start)
      .count();
}

inline grpc::ServerUnaryReactor* FinishUnary(
    grpc::CallbackServerContext* context, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

inline absl::Status StatusOfEnd(FinishReason reason, const absl::Status& error,
                                absl::string_view what) {
  if (reason == FinishReason::kCancelled) {
    return absl::CancelledError(absl::StrCat(what, " cancelled"));
  }
  if (!error.ok()) return error;
  return absl::InternalError(absl::StrCat(what, " ended without a result"));
}

// Turns one engine output stream into DecodeResponses: drops the first
// `skip_tokens` tokens and `skip_text_bytes` bytes of text (already sent to
// the client), closes the reactor on the final output. Engine thread only
// once attached.
class DecodeStream {
 public:
  DecodeStream(StreamReactor<v1::DecodeResponse>* reactor, int64_t skip_tokens,
               int64_t skip_text_bytes, double kv_wait_ms)
      : reactor_(reactor),
        skip_tokens_(skip_tokens),
        skip_text_bytes_(skip_text_bytes),
        kv_wait_ms_(kv_wait_ms),
        start_(SteadyClock::now()) {}

  // Returns true on the final output (the reactor is closed then).
  bool Forward(const RequestOutput& output) {
    if (reactor_ == nullptr) return true;
    v1::DecodeResponse response;
    for (const TokenOutput& token : output.tokens) {
      if (skip_tokens_ > 0) {
        --skip_tokens_;
        continue;
      }
      ++decode_tokens_;
      response.add_token_ids(token.token);
      if (token.logprob.has_value() || !token.processed.empty()) {
        *response.add_logprobs() = ToProto(token);
      }
    }
    absl::string_view text = output.text;
    const int64_t drop =
        std::min<int64_t>(skip_text_bytes_, static_cast<int64_t>(text.size()));
    skip_text_bytes_ -= drop;
    text.remove_prefix(drop);
    response.set_text(std::string(text));
    const bool final = output.finish_reason != FinishReason::kNone;
    if (final) {
      v1::DecodeResult* result = response.mutable_result();
      result->set_finish_reason(ToProto(output.finish_reason));
      if (!output.error.ok()) {
        result->set_error_code(static_cast<int32_t>(output.error.code()));
        result->set_error_message(std::string(output.error.message()));
      }
      result->set_decode_tokens(static_cast<int32_t>(decode_tokens_));
      result->set_decode_ms(MsSince(start_));
      result->set_kv_wait_ms(kv_wait_ms_);
    }
    if (final || response.token_ids_size() > 0 || !response.text().empty()) {
      reactor_->Push(std::move(response));
    }
    if (final) {
      reactor_->Close(grpc::Status::OK);
      reactor_ = nullptr;
    }
    return final;
  }

 private:
  StreamReactor<v1::DecodeResponse>* reactor_;
  int64_t skip_tokens_;
  int64_t skip_text_bytes_;
  int64_t decode_tokens_ = 0;
  double kv_wait_ms_;
  SteadyClock::time_point start_;
};

// A colocated request run start to finish here. Guarded by
// WorkerService::mu_.
struct LocalRequest {
  std::string id;
  int64_t prompt_tokens = 0;
  StreamReactor<v1::PrefillResponse>* prefill = nullptr;  // until first token
  SteadyClock::time_point arrival;
  std::vector<RequestOutput> buffered;  // output before Decode attached
  std::unique_ptr<DecodeStream> decode;
  bool finished = false;
  bool cancelled = false;
};

}  // namespace baton

#endif  // BATON_WORKER_SERVICE_WORKER_SERVICE_INTERNAL_H_
