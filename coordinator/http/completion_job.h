// One OpenAI completion request (chat or text) in flight: n Generate calls
// per prompt through the Baton service, merged into one non-streaming
// response or one SSE stream.
//
// Errors before any token are the HTTP error of the first failing call's
// status (so INVALID_ARGUMENT is a 400 with Baton's message). In a stream,
// a failure after the headers went out is an SSE event
// `data: {"error": {...}}` followed by `data: [DONE]`; the other calls are
// cancelled. A client that disconnects cancels every call, which frees the
// request's KV blocks in the cluster.
#ifndef BATON_COORDINATOR_HTTP_COMPLETION_JOB_H_
#define BATON_COORDINATOR_HTTP_COMPLETION_JOB_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "baton/v1/api.grpc.pb.h"
#include "coordinator/http/generate_stream.h"
#include "coordinator/http/http_server.h"
#include "coordinator/http/in_flight.h"
#include "coordinator/http/openai_request.h"
#include "coordinator/http/openai_response.h"

namespace baton::http {

// What every job needs from the gateway; outlives every job.
struct JobEnvironment {
  v1::Baton::Stub* stub = nullptr;
  InFlight* in_flight = nullptr;
  // A chat without max_tokens gets min(default_max_tokens, context_length
  // - prompt_tokens); default_max_tokens 0: no cap. (Baton reserves KV
  // blocks for max_tokens when a request starts, so filling the whole
  // context by default would reserve it for every request.)
  int64_t context_length = 0;
  int64_t default_max_tokens = 0;
  TokenBytesFn token_bytes;
};

class CompletionJob : public std::enable_shared_from_this<CompletionJob> {
 public:
  // Runs the request and answers on `exchange`; returns at once.
  static void Start(const JobEnvironment* env, OpenAiRequest request,
                    std::shared_ptr<HttpExchange> exchange);

  CompletionJob(const JobEnvironment* env, OpenAiRequest request,
                std::shared_ptr<HttpExchange> exchange);

 private:
  struct Choice {
    std::shared_ptr<GenerateStream> stream;
    bool started = false;  // first message seen
    bool done = false;
    std::string text;
    nlohmann::json logprobs;  // non-streaming accumulation
    int64_t text_offset = 0;
    std::string finish_reason;
    v1::Usage usage;
  };

  // Sets max_tokens from the prompt length (Tokenize), then Launch.
  void FillContextThenLaunch();
  void Launch();
  void OnMessage(int index, v1::GenerateResponse message);
  // How the OpenAI request names choice `index`'s prompt ("messages",
  // "prompt", "prompt[i]"), for its errors.
  std::string PromptField(int index) const;
  // The call ended: `retry_after` is the delay a refusal asked for. May
  // run before GenerateStream::Start returned (a refusal comes at once),
  // so it must not touch choices_[index].stream.
  void OnDone(int index, const grpc::Status& status,
              std::optional<absl::Duration> retry_after);
  void Cancel();
  // The first failure wins: in a stream that has started, its error event
  // goes out; the calls still running are added to `to_cancel` (cancelled
  // by the caller after releasing mu_: a cancel may run gRPC callbacks
  // inline).
  void Fail(absl::Status status,
            std::vector<std::shared_ptr<GenerateStream>>& to_cancel)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every call has ended (or none was started): the last bytes, then the
  // exchange and the in-flight entry are released.
  void Finish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::Usage TotalUsage() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When the whole request failed before any token: reply with the error.
  void RespondError(const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const JobEnvironment* const env_;
  // max_tokens is filled in (fill_context) before Launch, then constant.
  OpenAiRequest request_;
  const std::string id_;
  const ResponseFormatter formatter_;
  uint64_t in_flight_id_ = 0;

  absl::Mutex mu_;
  std::shared_ptr<HttpExchange> exchange_ ABSL_GUARDED_BY(mu_);
  std::vector<Choice> choices_ ABSL_GUARDED_BY(mu_);
  int done_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool headers_sent_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::http

#endif  // BATON_COORDINATOR_HTTP_COMPLETION_JOB_H_
