#include "cli/remote_generate.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "baton/v1/api.grpc.pb.h"
#include "common/status_macros.h"

namespace baton::cli {
namespace {

using Json = nlohmann::json;

// How often a waiting RunRemoteGenerate looks at `interrupted`.
constexpr absl::Duration kInterruptPoll = absl::Milliseconds(20);

absl::Status FromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

FinishReason FromProto(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return FinishReason::kStop;
    case v1::FINISH_REASON_LENGTH:
      return FinishReason::kLength;
    case v1::FINISH_REASON_CANCELLED:
      return FinishReason::kCancelled;
    case v1::FINISH_REASON_ERROR:
      return FinishReason::kError;
    default:
      return FinishReason::kNone;
  }
}

// "KV_TRANSPORT_HOST_TCP" -> "host_tcp".
std::string TransportName(v1::KvTransport transport) {
  std::string name = v1::KvTransport_Name(transport);
  constexpr absl::string_view kPrefix = "KV_TRANSPORT_";
  if (absl::StartsWith(name, kPrefix)) name.erase(0, kPrefix.size());
  return absl::AsciiStrToLower(name);
}

TokenOutput FromProto(int32_t token, const v1::TokenLogprobs* report) {
  TokenOutput t;
  t.token = token;
  if (report == nullptr) return t;
  if (report->has_logprob()) t.logprob = report->logprob();
  for (const v1::TokenLogprob& a : report->top_logprobs()) {
    t.top_logprobs.push_back({a.token_id(), a.logprob()});
  }
  for (const v1::TokenProb& p : report->processed()) {
    t.processed.push_back({p.token_id(), p.prob()});
  }
  return t;
}

// One line per token for --show_probs without --json: the text that came
// with the token (or its id) and the candidates of the sampled distribution.
void PrintProbs(const TokenOutput& t, absl::string_view text,
                std::ostream& out) {
  std::string label = text.empty() ? absl::StrCat("#", t.token)
                                   : JsonLine(Json(std::string(text)));
  out << absl::StrFormat("%-20s", label);
  for (const TokenProb& p : t.processed) {
    out << absl::StrFormat("  #%d %.4f", p.token, p.prob);
  }
  out << "\n";
}

// One Generate stream. OnReadDone and OnDone run on gRPC threads; the
// collected fields are read only after done() is true.
class GenerateCall final
    : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  // `stream_to`: where text (or --show_probs lines) goes as it arrives; null
  // to only collect.
  GenerateCall(v1::GenerateRequest request, int64_t deadline_ms,
               bool show_probs, std::ostream* stream_to, absl::Mutex* mu,
               int* pending)
      : request_(std::move(request)),
        show_probs_(show_probs),
        stream_to_(stream_to),
        mu_(mu),
        pending_(pending) {
    if (deadline_ms > 0) {
      context_.set_deadline(std::chrono::system_clock::now() +
                            std::chrono::milliseconds(deadline_ms));
    }
  }

  void Start(v1::Baton::Stub* stub) {
    stub->async()->Generate(&context_, &request_, this);
    StartRead(&response_);
    StartCall();
  }

  void Cancel() { context_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows with the status.
    got_message_ = true;
    if (!response_.request_id().empty()) request_id_ = response_.request_id();
    const bool has_reports =
        response_.logprobs_size() == response_.token_ids_size();
    for (int i = 0; i < response_.token_ids_size(); ++i) {
      record_.tokens.push_back(
          FromProto(response_.token_ids(i),
                    has_reports ? &response_.logprobs(i) : nullptr));
      if (stream_to_ != nullptr && show_probs_) {
        PrintProbs(record_.tokens.back(),
                   response_.token_ids_size() == 1 ? response_.text() : "",
                   *stream_to_);
      }
    }
    record_.text += response_.text();
    if (stream_to_ != nullptr && !show_probs_) {
      *stream_to_ << response_.text() << std::flush;
    }
    if (response_.has_result()) {
      result_ = response_.result();
      has_result_ = true;
    }
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    Finish(status);
    absl::MutexLock lock(mu_);
    --*pending_;
  }

  // Valid once OnDone ran.
  const GenerationRecord& record() const { return record_; }
  const v1::GenerateResult& result() const { return result_; }
  bool has_result() const { return has_result_; }
  bool got_message() const { return got_message_; }
  const std::string& request_id() const { return request_id_; }

 private:
  void Finish(const grpc::Status& status) {
    if (!status.ok()) {
      record_.finish_reason = FinishReason::kError;
      record_.error = FromGrpc(status);
      return;
    }
    if (!has_result_) {
      record_.finish_reason = FinishReason::kError;
      record_.error =
          absl::InternalError("Generate stream ended without a result");
      return;
    }
    record_.finish_reason = FromProto(result_.finish_reason());
    if (record_.finish_reason == FinishReason::kNone) {
      record_.finish_reason = FinishReason::kError;
      record_.error =
          absl::InternalError("Generate result has finish_reason UNSPECIFIED");
    } else if (record_.finish_reason == FinishReason::kError) {
      const int code = result_.error_code();
      record_.error = absl::Status(code > 0 && code <= 16
                                       ? static_cast<absl::StatusCode>(code)
                                       : absl::StatusCode::kUnknown,
                                   result_.error_message());
    }
    record_.prompt_tokens = result_.usage().prompt_tokens();
    record_.ttft_ms = result_.timings().ttft_ms();
    record_.decode_tokens_per_s = result_.timings().decode_tokens_per_s();
  }

  grpc::ClientContext context_;
  const v1::GenerateRequest request_;
  const bool show_probs_;
  std::ostream* const stream_to_;
  absl::Mutex* const mu_;
  int* const pending_;  // guarded by *mu_
  v1::GenerateResponse response_;
  GenerationRecord record_;
  v1::GenerateResult result_;
  bool has_result_ = false;
  bool got_message_ = false;
  std::string request_id_;
};

Json RemoteJson(const GenerateCall& call, bool logprobs, bool show_probs) {
  Json j = GenerationJson(call.record(), nullptr, logprobs, show_probs);
  j["request_id"] = call.request_id();
  if (!call.record().error.ok()) {
    j["error_code"] = absl::StatusCodeToString(call.record().error.code());
    j["error_message"] = std::string(call.record().error.message());
  }
  if (!call.has_result()) return j;
  const v1::GenerateResult& r = call.result();
  j["seed"] = r.seed();
  j["usage"] = {{"prompt_tokens", r.usage().prompt_tokens()},
                {"completion_tokens", r.usage().completion_tokens()},
                {"cached_tokens", r.usage().cached_tokens()}};
  const v1::PhaseTimings& t = r.timings();
  j["timings"] = {{"queue_ms", t.queue_ms()},
                  {"reserve_kv_ms", t.reserve_kv_ms()},
                  {"prefill_ms", t.prefill_ms()},
                  {"kv_transfer_bytes", t.kv_transfer_bytes()},
                  {"kv_transfer_ms", t.kv_transfer_ms()},
                  {"kv_transfer_exposed_ms", t.kv_transfer_exposed_ms()},
                  {"kv_transfer_cached_tokens", t.kv_transfer_cached_tokens()},
                  {"ttft_ms", t.ttft_ms()},
                  {"decode_tokens_per_s", t.decode_tokens_per_s()},
                  {"total_ms", t.total_ms()}};
  j["prefill_worker"] = r.prefill_worker().worker_id();
  j["decode_worker"] = r.decode_worker().worker_id();
  j["kv_transport"] = TransportName(r.kv_transport());
  j["migrations"] = r.migrations();
  j["retries"] = r.retries();
  if (r.has_stop_string()) j["stop_string"] = r.stop_string();
  if (r.has_stop_token_id()) j["stop_token_id"] = r.stop_token_id();
  return j;
}

// The stderr lines after a streamed generation.
std::string RemoteSummary(const GenerateCall& call) {
  std::string s = GenerationSummary(call.record());
  const v1::GenerateResult& r = call.result();
  const v1::PhaseTimings& t = r.timings();
  absl::StrAppendFormat(
      &s,
      "[request %s, seed %d] queue %.1f ms, prefill %.1f ms, KV %d bytes in "
      "%.1f ms (%.1f ms exposed, %s), total %.1f ms\n"
      "[prefill worker %s (%s), decode worker %s (%s)]\n",
      call.request_id(), r.seed(), t.queue_ms(), t.prefill_ms(),
      t.kv_transfer_bytes(), t.kv_transfer_ms(), t.kv_transfer_exposed_ms(),
      TransportName(r.kv_transport()), t.total_ms(),
      r.prefill_worker().worker_id(), r.prefill_worker().address(),
      r.decode_worker().worker_id(), r.decode_worker().address());
  if (r.migrations() > 0) {
    absl::StrAppendFormat(&s,
                          "[moved to another decode worker %d time(s) after "
                          "a fault; the output is unchanged]\n",
                          r.migrations());
  }
  if (r.retries() > 0) {
    absl::StrAppendFormat(&s,
                          "[started over %d time(s) after a fault before the "
                          "first token; the output is unchanged]\n",
                          r.retries());
  }
  return s;
}

}  // namespace

v1::SamplingParams SamplingToProto(const SamplingParams& params) {
  v1::SamplingParams proto;
  proto.set_temperature(params.temperature);
  proto.set_top_k(params.top_k);
  proto.set_top_p(params.top_p);
  proto.set_min_p(params.min_p);
  proto.set_repetition_penalty(params.repetition_penalty);
  proto.set_frequency_penalty(params.frequency_penalty);
  proto.set_presence_penalty(params.presence_penalty);
  if (params.seed.has_value()) proto.set_seed(*params.seed);
  proto.set_max_tokens(params.max_tokens);
  for (int32_t id : params.stop_token_ids) proto.add_stop_token_ids(id);
  for (const std::string& stop : params.stop) proto.add_stop(stop);
  proto.set_ignore_eos(params.ignore_eos);
  if (params.logprobs.has_value()) proto.set_logprobs(*params.logprobs);
  proto.set_show_probs(params.show_probs);
  return proto;
}

v1::GenerateRequest MakeGenerateRequest(const std::string& prompt, bool raw,
                                        const std::string& model_id,
                                        const SamplingParams& sampling) {
  v1::GenerateRequest request;
  request.set_model(model_id);
  if (raw) {
    request.set_text(prompt);
  } else {
    v1::ChatMessage* message = request.mutable_chat()->add_messages();
    message->set_role("user");
    message->set_content(prompt);
  }
  *request.mutable_sampling() = SamplingToProto(sampling);
  return request;
}

absl::Status RunRemoteGenerate(const RemoteGenerateOptions& options,
                               std::ostream& out, std::ostream& err) {
  if (options.server.empty()) {
    return absl::InvalidArgumentError("--server: HOST:PORT is required");
  }
  if (options.deadline_ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--deadline_ms must be >= 0 (0 = none), got ", options.deadline_ms));
  }
  const GenerateOptions& g = options.generate;
  BATON_ASSIGN_OR_RETURN(std::vector<std::string> prompts, CollectPrompts(g));
  const SamplingParams sampling = EffectiveSampling(g);
  BATON_RETURN_IF_ERROR(ValidateSamplingFields(sampling));
  const bool json = g.json || !g.prompts_file.empty();

  BATON_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                         OpenChannel(options.server, options.security));
  auto stub = v1::Baton::NewStub(channel);
  absl::Mutex mu;
  int pending = static_cast<int>(prompts.size());
  std::vector<std::unique_ptr<GenerateCall>> calls;
  for (const std::string& prompt : prompts) {
    calls.push_back(std::make_unique<GenerateCall>(
        MakeGenerateRequest(prompt, g.raw, options.model_id, sampling),
        options.deadline_ms, g.show_probs, json ? nullptr : &out, &mu,
        &pending));
  }
  for (auto& call : calls) call->Start(stub.get());

  bool interrupted = false;
  {
    absl::MutexLock lock(&mu);
    const auto all_done = [&pending]() ABSL_SHARED_LOCKS_REQUIRED(mu) {
      return pending == 0;
    };
    while (pending > 0) {
      if (options.interrupted == nullptr) {
        mu.Await(absl::Condition(&all_done));
        break;
      }
      mu.AwaitWithTimeout(absl::Condition(&all_done), kInterruptPoll);
      if (!interrupted && options.interrupted->load()) {
        interrupted = true;
        for (auto& call : calls) call->Cancel();
      }
    }
  }
  if (interrupted) {
    if (!json) out << "\n";
    return absl::CancelledError("interrupted");
  }

  absl::Status first_error;
  for (size_t i = 0; i < calls.size(); ++i) {
    const absl::Status& e = calls[i]->record().error;
    if (e.ok() || !first_error.ok()) continue;
    first_error = calls.size() == 1
                      ? e
                      : absl::Status(e.code(), absl::StrCat("prompt ", i + 1,
                                                            ": ", e.message()));
  }
  if (!json) {
    const GenerateCall& call = *calls[0];
    if (call.got_message()) out << "\n";
    if (!first_error.ok()) return first_error;
    err << RemoteSummary(call);
    return absl::OkStatus();
  }
  for (const auto& call : calls) {
    out << JsonLine(
               RemoteJson(*call, sampling.logprobs.has_value(), g.show_probs))
        << "\n";
  }
  return first_error;
}

}  // namespace baton::cli
