#include "coordinator/http/completion_job.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc/grpc_status.h"
#include "common/tsan/annotations.h"
#include "coordinator/http/openai_error.h"

namespace baton::http {
namespace {

using Streams = std::vector<std::shared_ptr<GenerateStream>>;

std::string NewId(Endpoint endpoint) {
  static const uint64_t process_tag = [] {
    std::random_device device;
    return (static_cast<uint64_t>(device()) << 32) ^ device();
  }();
  static std::atomic<uint64_t> counter{0};
  return absl::StrCat(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-",
                      absl::Hex(process_tag, absl::kZeroPad16),
                      absl::Hex(counter.fetch_add(1), absl::kZeroPad8));
}

void CancelAll(const Streams& streams) {
  for (const auto& stream : streams) stream->Cancel();
}

}  // namespace

CompletionJob::CompletionJob(const JobEnvironment* env, OpenAiRequest request,
                             std::shared_ptr<HttpExchange> exchange)
    : env_(env),
      request_(std::move(request)),
      id_(NewId(request_.endpoint)),
      formatter_(request_, id_, absl::ToUnixSeconds(absl::Now()),
                 env->token_bytes),
      exchange_(std::move(exchange)) {
  choices_.resize(request_.prompts.size() * static_cast<size_t>(request_.n));
}

void CompletionJob::Start(const JobEnvironment* env, OpenAiRequest request,
                          std::shared_ptr<HttpExchange> exchange) {
  auto job = std::make_shared<CompletionJob>(env, std::move(request),
                                             std::move(exchange));
  std::weak_ptr<CompletionJob> weak = job;
  auto cancel = [weak] {
    if (auto j = weak.lock()) j->Cancel();
  };
  job->in_flight_id_ = env->in_flight->Add(cancel);
  {
    absl::MutexLock lock(&job->mu_);
    job->exchange_->SetOnDisconnect(cancel);
  }
  if (job->request_.fill_context) {
    job->FillContextThenLaunch();
  } else {
    job->Launch();
  }
}

void CompletionJob::FillContextThenLaunch() {
  struct Call {
    grpc::ClientContext context;
    v1::TokenizeRequest request;
    v1::TokenizeResponse response;
  };
  auto call = std::make_shared<Call>();
  call->request.set_model(request_.model);
  *call->request.mutable_chat() = request_.prompts.at(0).chat();
  call->context.set_deadline(std::chrono::system_clock::now() +
                             std::chrono::seconds(30));
  BATON_TSAN_RELEASE(this);  // see common/tsan/annotations.h
  env_->stub->async()->Tokenize(
      &call->context, &call->request, &call->response,
      [self = shared_from_this(), call](grpc::Status status) {
        BATON_TSAN_ACQUIRE(self.get());
        if (!status.ok()) {
          Streams none;
          absl::MutexLock lock(&self->mu_);
          self->Fail(InRequestTerms(FromGrpc(status), "messages"), none);
          self->Finish();
          return;
        }
        const int64_t prompt = call->response.token_ids_size();
        int64_t room = self->env_->context_length - prompt;
        if (room < 1) {
          Streams none;
          absl::MutexLock lock(&self->mu_);
          self->Fail(absl::InvalidArgumentError(
                         absl::StrCat("messages: the chat is ", prompt,
                                      " tokens; the model's context holds ",
                                      self->env_->context_length,
                                      ", leaving no room for an answer")),
                     none);
          self->Finish();
          return;
        }
        // What the largest decode worker can hold, so a chat that fits
        // there is not refused for a max_tokens its client never sent.
        if (const int64_t capacity = call->response.max_request_tokens();
            capacity > prompt) {
          room = std::min(room, capacity - prompt);
        }
        if (self->env_->default_max_tokens > 0) {
          room = std::min(room, self->env_->default_max_tokens);
        }
        self->request_.prompts[0].mutable_sampling()->set_max_tokens(
            static_cast<int32_t>(std::min<int64_t>(room, INT32_MAX)));
        self->Launch();
      });
}

void CompletionJob::Launch() {
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) {
      Streams none;
      Fail(absl::CancelledError("the client disconnected"), none);
      return Finish();
    }
  }
  const int n = request_.n;
  for (size_t i = 0; i < choices_.size(); ++i) {
    const int index = static_cast<int>(i);
    v1::GenerateRequest generate = ChoiceRequest(request_, index / n, index % n,
                                                 absl::StrCat(id_, "-", index));
    GenerateCallbacks callbacks;
    callbacks.on_message = [self = shared_from_this(),
                            index](v1::GenerateResponse message) {
      self->OnMessage(index, std::move(message));
    };
    callbacks.on_done = [self = shared_from_this(), index](
                            const grpc::Status& status,
                            std::optional<absl::Duration> retry_after) {
      self->OnDone(index, status, retry_after);
    };
    BATON_TSAN_RELEASE(this);
    std::shared_ptr<GenerateStream> stream = GenerateStream::Start(
        env_->stub, std::move(generate), std::move(callbacks));
    bool cancel = false;
    {
      absl::MutexLock lock(&mu_);
      choices_[i].stream = stream;
      cancel = cancelled_ || !failure_.ok();
    }
    if (cancel) stream->Cancel();
  }
}

void CompletionJob::OnMessage(int index, v1::GenerateResponse message) {
  Streams to_cancel;
  {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok() || cancelled_) return;
    Choice& choice = choices_[static_cast<size_t>(index)];
    const bool first = !choice.started;
    choice.started = true;
    nlohmann::json logprobs;  // null
    if (request_.logprobs && message.logprobs_size() > 0) {
      nlohmann::json& target = request_.stream ? logprobs : choice.logprobs;
      if (target.is_null()) target = formatter_.NewLogprobs();
      formatter_.AppendLogprobs(message.logprobs(), target, choice.text_offset);
    }
    if (request_.stream) {
      if (!headers_sent_) {
        exchange_->StartStream(200, "text/event-stream");
        headers_sent_ = true;
      }
      if (first && request_.endpoint == Endpoint::kChat) {
        exchange_->Write(SseEvent(formatter_.RoleChunk(index)));
      }
      if (!message.text().empty() || !logprobs.is_null()) {
        exchange_->Write(SseEvent(
            formatter_.TextChunk(index, message.text(), std::move(logprobs))));
      }
    } else {
      choice.text += message.text();
    }
    if (message.has_result()) {
      const v1::GenerateResult& result = message.result();
      choice.usage = result.usage();
      if (result.finish_reason() == v1::FINISH_REASON_ERROR) {
        const auto code =
            result.error_code() == 0
                ? absl::StatusCode::kInternal
                : static_cast<absl::StatusCode>(result.error_code());
        Fail(absl::Status(code, result.error_message()), to_cancel);
      } else {
        choice.finish_reason = FinishReasonName(result.finish_reason());
        if (request_.stream) {
          exchange_->Write(
              SseEvent(formatter_.FinishChunk(index, choice.finish_reason)));
        }
      }
    }
  }
  CancelAll(to_cancel);
}

void CompletionJob::OnDone(int index, const grpc::Status& status,
                           std::optional<absl::Duration> retry_after) {
  Streams to_cancel;
  {
    absl::MutexLock lock(&mu_);
    Choice& choice = choices_[static_cast<size_t>(index)];
    choice.done = true;
    ++done_;
    if (choice.finish_reason.empty() && failure_.ok()) {
      absl::Status why =
          cancelled_    ? absl::CancelledError("the client disconnected")
          : status.ok() ? absl::InternalError("Generate ended without a result")
                        : InRequestTerms(FromGrpc(status), PromptField(index));
      if (retry_after.has_value()) SetRetryAfter(why, *retry_after);
      Fail(std::move(why), to_cancel);
    }
    if (done_ == static_cast<int>(choices_.size())) Finish();
  }
  CancelAll(to_cancel);
}

std::string CompletionJob::PromptField(int index) const {
  if (request_.endpoint == Endpoint::kChat) return "messages";
  if (request_.prompts.size() == 1) return "prompt";
  return absl::StrCat("prompt[", index / request_.n, "]");
}

void CompletionJob::Cancel() {
  Streams to_cancel;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return;
    cancelled_ = true;
    for (const Choice& c : choices_) {
      if (c.stream != nullptr && !c.done) to_cancel.push_back(c.stream);
    }
  }
  CancelAll(to_cancel);
}

void CompletionJob::Fail(absl::Status status, Streams& to_cancel) {
  if (!failure_.ok()) return;
  failure_ = std::move(status);
  if (request_.stream && headers_sent_) {
    exchange_->Write(SseEvent(ErrorJson(failure_)));
  }
  for (const Choice& c : choices_) {
    if (c.stream != nullptr && !c.done) to_cancel.push_back(c.stream);
  }
}

v1::Usage CompletionJob::TotalUsage() const {
  v1::Usage total;
  const size_t n = static_cast<size_t>(request_.n);
  for (size_t p = 0; p < request_.prompts.size(); ++p) {
    int32_t prompt_tokens = 0;
    int32_t cached_tokens = 0;
    for (size_t c = 0; c < n; ++c) {
      const v1::Usage& u = choices_[p * n + c].usage;
      prompt_tokens = std::max(prompt_tokens, u.prompt_tokens());
      cached_tokens = std::max(cached_tokens, u.cached_tokens());
      total.set_completion_tokens(total.completion_tokens() +
                                  u.completion_tokens());
    }
    total.set_prompt_tokens(total.prompt_tokens() + prompt_tokens);
    total.set_cached_tokens(total.cached_tokens() + cached_tokens);
  }
  return total;
}

void CompletionJob::RespondError(const absl::Status& status) {
  HttpError error = ToHttpError(status);
  HttpHeaders headers;
  if (auto delay = RetryAfterOf(status); delay.has_value()) {
    // Whole seconds, rounded up (RFC 9110).
    headers.emplace_back("Retry-After",
                         absl::StrCat(absl::ToInt64Seconds(
                             absl::Ceil(*delay, absl::Seconds(1)))));
  }
  exchange_->Respond(error.status, "application/json", std::move(error.body),
                     std::move(headers));
}

void CompletionJob::Finish() {
  if (exchange_ == nullptr) return;
  if (request_.stream && headers_sent_) {
    if (failure_.ok() && request_.include_usage) {
      exchange_->Write(SseEvent(formatter_.UsageChunk(TotalUsage())));
    }
    exchange_->Write(kSseDone);
    exchange_->EndStream();
  } else if (!failure_.ok()) {
    RespondError(failure_);
  } else if (request_.stream) {
    RespondError(absl::InternalError("Generate streamed nothing"));
  } else {
    std::vector<ChoiceResult> results;
    for (size_t i = 0; i < choices_.size(); ++i) {
      ChoiceResult r;
      r.index = static_cast<int>(i);
      r.text = std::move(choices_[i].text);
      r.logprobs = request_.logprobs && choices_[i].logprobs.is_null()
                       ? formatter_.NewLogprobs()
                       : std::move(choices_[i].logprobs);
      r.finish_reason = choices_[i].finish_reason;
      results.push_back(std::move(r));
    }
    exchange_->Respond(200, "application/json",
                       DumpJson(formatter_.Completion(results, TotalUsage())));
  }
  exchange_.reset();
  env_->in_flight->Remove(in_flight_id_);
}

}  // namespace baton::http
