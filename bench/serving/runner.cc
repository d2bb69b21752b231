#include "bench/serving/runner.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "baton/v1/api.grpc.pb.h"
#include "bench/serving/progress.h"
#include "common/status_macros.h"

namespace baton::bench {
namespace {

using Clock = std::chrono::steady_clock;

// How often a waiting dispatcher looks at the time limit, the interrupt
// flag and the progress bar.
constexpr auto kPoll = std::chrono::milliseconds(20);

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}
double Millis(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

double CpuSeconds(const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; }

std::string FinishReasonName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_CANCELLED:
      return "cancelled";
    case v1::FINISH_REASON_ERROR:
      return "error";
    default:
      return "";
  }
}

// Counters shared by the dispatcher and the calls' OnDone.
struct RunState {
  absl::Mutex mu;
  int in_flight ABSL_GUARDED_BY(mu) = 0;
  int sent ABSL_GUARDED_BY(mu) = 0;
  int done ABSL_GUARDED_BY(mu) = 0;
  int failed ABSL_GUARDED_BY(mu) = 0;
};

// One Generate stream. OnReadDone and OnDone run on gRPC threads and only
// timestamp and count; `record` is complete once OnDone has released the
// in-flight count.
class BenchCall final : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  BenchCall(v1::GenerateRequest request, RequestRecord* record,
            Clock::time_point run_start, RunState* state)
      : request_(std::move(request)),
        record_(record),
        run_start_(run_start),
        state_(state) {}

  void Start(v1::Baton::Stub* stub, double timeout_s) {
    context_.set_deadline(
        std::chrono::system_clock::now() +
        std::chrono::duration_cast<std::chrono::system_clock::duration>(
            std::chrono::duration<double>(timeout_s)));
    stub->async()->Generate(&context_, &request_, this);
    StartRead(&response_);
    send_ = Clock::now();
    record_->sent = true;
    record_->send_time_s = Seconds(send_ - run_start_);
    StartCall();
  }

  void Cancel() {
    cancelled_.store(true);
    context_.TryCancel();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows with the status.
    const Clock::time_point now = Clock::now();
    const int k = response_.token_ids_size();
    if (k > 0) {
      if (record_->output_tokens == 0) {
        record_->ttft_ms = Millis(now - send_);
      } else {
        record_->itl_ms.push_back(Millis(now - last_token_));
      }
      last_token_ = now;
      record_->output_tokens += k;
    }
    if (response_.has_result()) {
      result_time_ = now;
      result_ = response_.result();
      has_result_ = true;
    }
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    Record(status);
    absl::MutexLock lock(&state_->mu);
    --state_->in_flight;
    ++state_->done;
    if (!record_->success && !record_->aborted) ++state_->failed;
  }

 private:
  void Record(const grpc::Status& status) {
    RequestRecord& r = *record_;
    r.end_time_s = Seconds(Clock::now() - run_start_);
    if (!status.ok()) {
      r.aborted = cancelled_.load();
      r.error_code = static_cast<absl::StatusCode>(status.error_code());
      r.error_message = status.error_message();
      return;
    }
    if (!has_result_) {
      r.error_code = absl::StatusCode::kInternal;
      r.error_message = "Generate stream ended without a result";
      return;
    }
    r.e2el_ms = Millis(result_time_ - send_);
    r.finish_reason = FinishReasonName(result_.finish_reason());
    if (result_.usage().prompt_tokens() > 0) {
      r.prompt_tokens = result_.usage().prompt_tokens();
      r.cached_tokens = result_.usage().cached_tokens();
    }
    const v1::PhaseTimings& t = result_.timings();
    r.server = {t.queue_ms(),
                t.prefill_ms(),
                t.kv_transfer_bytes(),
                t.kv_transfer_ms(),
                t.kv_transfer_exposed_ms(),
                t.ttft_ms(),
                t.total_ms(),
                t.reserve_kv_ms(),
                t.reserve_kv_beside_prefill()};
    r.prefill_worker = result_.prefill_worker().worker_id();
    r.decode_worker = result_.decode_worker().worker_id();
    switch (result_.finish_reason()) {
      case v1::FINISH_REASON_STOP:
      case v1::FINISH_REASON_LENGTH:
        r.success = true;
        return;
      case v1::FINISH_REASON_CANCELLED:
        r.error_code = absl::StatusCode::kCancelled;
        r.error_message = "cancelled by the server";
        return;
      case v1::FINISH_REASON_ERROR: {
        const int code = result_.error_code();
        r.error_code = code > 0 && code <= 16
                           ? static_cast<absl::StatusCode>(code)
                           : absl::StatusCode::kUnknown;
        r.error_message = result_.error_message();
        return;
      }
      default:
        r.error_code = absl::StatusCode::kInternal;
        r.error_message = "Generate result has finish_reason UNSPECIFIED";
    }
  }

  grpc::ClientContext context_;
  const v1::GenerateRequest request_;
  RequestRecord* const record_;
  const Clock::time_point run_start_;
  RunState* const state_;
  std::atomic<bool> cancelled_{false};
  Clock::time_point send_;
  Clock::time_point last_token_;
  Clock::time_point result_time_;
  v1::GenerateResponse response_;
  v1::GenerateResult result_;
  bool has_result_ = false;
};

}  // namespace

absl::Status ValidateRunnerOptions(const RunnerOptions& options) {
  BATON_RETURN_IF_ERROR(ValidateArrivalOptions(options.arrivals));
  if (options.max_concurrency < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-concurrency must be >= 0 (0 = unbounded), got ",
                     options.max_concurrency));
  }
  if (!(options.request_timeout_s > 0) ||
      !std::isfinite(options.request_timeout_s)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--request-timeout-s must be a finite number > 0, got ",
                     options.request_timeout_s));
  }
  if (!(options.max_duration_s >= 0) ||
      !std::isfinite(options.max_duration_s)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-duration-s must be >= 0 (0 = none), got ",
                     options.max_duration_s));
  }
  if (!(options.temperature >= 0) || !std::isfinite(options.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--temperature must be a finite number >= 0, got ",
                     options.temperature));
  }
  return absl::OkStatus();
}

v1::GenerateRequest MakeBenchRequest(const BenchPrompt& prompt, int index,
                                     const RunnerOptions& options) {
  v1::GenerateRequest request;
  request.set_request_id(absl::StrCat(options.request_id_prefix, index));
  request.set_model(options.model);
  if (!prompt.token_ids.empty()) {
    request.mutable_token_ids()->mutable_token_ids()->Add(
        prompt.token_ids.begin(), prompt.token_ids.end());
  } else {
    v1::ChatMessage* message = request.mutable_chat()->add_messages();
    message->set_role("user");
    message->set_content(prompt.chat_text);
  }
  v1::SamplingParams* sampling = request.mutable_sampling();
  sampling->set_temperature(options.temperature);
  sampling->set_seed(options.seed + static_cast<uint64_t>(index));
  sampling->set_max_tokens(prompt.output_len);
  sampling->set_ignore_eos(options.ignore_eos);
  return request;
}

absl::Status WaitForServer(grpc::Channel& channel, const std::string& target,
                           absl::Duration timeout) {
  const auto deadline =
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
  if (channel.WaitForConnected(deadline)) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("cannot connect to the Baton server at '", target,
                   "' within ", absl::FormatDuration(timeout),
                   " (is a baton-coordinator listening there?)"));
}

absl::StatusOr<RunResult> RunWorkload(std::shared_ptr<grpc::Channel> channel,
                                      const std::vector<BenchPrompt>& prompts,
                                      const RunnerOptions& options) {
  BATON_RETURN_IF_ERROR(ValidateRunnerOptions(options));
  const int n = static_cast<int>(prompts.size());
  BATON_ASSIGN_OR_RETURN(const std::vector<double> offsets,
                         ArrivalOffsets(n, options.arrivals, options.seed));
  auto stub = v1::Baton::NewStub(std::move(channel));
  RunResult result;
  result.records.resize(n);
  std::vector<std::unique_ptr<BenchCall>> calls(n);
  for (int i = 0; i < n; ++i) {
    RequestRecord& r = result.records[i];
    r.index = i;
    r.request_id = absl::StrCat(options.request_id_prefix, i);
    r.input_len = r.prompt_tokens = prompts[i].input_len;
    r.expected_output_len = prompts[i].output_len;
  }

  // Built before the clock starts, so that sending is only sending.
  std::vector<v1::GenerateRequest> requests;
  requests.reserve(n);
  for (int i = 0; i < n; ++i) {
    requests.push_back(MakeBenchRequest(prompts[i], i, options));
  }

  RunState state;
  std::optional<ProgressBar> bar;
  if (options.progress != nullptr) bar.emplace(*options.progress);
  rusage usage_before{};
  getrusage(RUSAGE_SELF, &usage_before);
  const Clock::time_point start = Clock::now();
  const Clock::time_point limit =
      options.max_duration_s > 0
          ? start + std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double>(options.max_duration_s))
          : Clock::time_point::max();
  // Records why the run stops early; true once it should.
  const auto should_stop = [&]() {
    if (options.interrupted != nullptr && options.interrupted->load()) {
      result.interrupted = true;
    }
    if (Clock::now() >= limit) result.hit_time_limit = true;
    return result.interrupted || result.hit_time_limit;
  };
  const auto progress = [&](bool finish) {
    if (!bar.has_value()) return;
    ProgressCounts c;
    {
      absl::MutexLock lock(&state.mu);
      c = {n, state.sent, state.done, state.failed,
           Seconds(Clock::now() - start)};
    }
    finish ? bar->Finish(c) : bar->Update(c);
  };
  const auto slot_free = [&]() ABSL_SHARED_LOCKS_REQUIRED(state.mu) {
    return options.max_concurrency == 0 ||
           state.in_flight < options.max_concurrency;
  };

  bool stop = false;
  for (int i = 0; i < n && !stop; ++i) {
    const Clock::time_point due =
        start + std::chrono::duration_cast<Clock::duration>(
                    std::chrono::duration<double>(offsets[i]));
    while (!(stop = should_stop()) && Clock::now() < due) {
      std::this_thread::sleep_until(std::min(due, Clock::now() + kPoll));
      progress(false);
    }
    while (!stop) {
      {
        absl::MutexLock lock(&state.mu);
        if (state.mu.AwaitWithTimeout(absl::Condition(&slot_free),
                                      absl::FromChrono(kPoll))) {
          ++state.in_flight;
          ++state.sent;
          break;
        }
      }
      progress(false);
      stop = should_stop();
    }
    if (stop) break;
    calls[i] = std::make_unique<BenchCall>(std::move(requests[i]),
                                           &result.records[i], start, &state);
    calls[i]->Start(stub.get(), options.request_timeout_s);
  }

  bool cancelled = false;
  const auto all_done = [&]() ABSL_SHARED_LOCKS_REQUIRED(state.mu) {
    return state.in_flight == 0;
  };
  while (true) {
    {
      absl::MutexLock lock(&state.mu);
      if (state.mu.AwaitWithTimeout(absl::Condition(&all_done),
                                    absl::FromChrono(kPoll))) {
        break;
      }
    }
    if (!cancelled && (stop || should_stop())) {
      cancelled = true;
      for (auto& call : calls) {
        if (call != nullptr) call->Cancel();
      }
    }
    progress(false);
  }
  result.wall_s = Seconds(Clock::now() - start);
  progress(true);
  rusage usage_after{};
  getrusage(RUSAGE_SELF, &usage_after);
  result.cpu_user_s =
      CpuSeconds(usage_after.ru_utime) - CpuSeconds(usage_before.ru_utime);
  result.cpu_system_s =
      CpuSeconds(usage_after.ru_stime) - CpuSeconds(usage_before.ru_stime);
  return result;
}

}  // namespace baton::bench
