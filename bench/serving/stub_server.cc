#include "bench/serving/stub_server.h"

#include <atomic>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "baton/v1/api.grpc.pb.h"
#include "common/grpc/stream_reactor.h"

namespace baton::bench {
namespace {

// FNV-1a over the id's bytes and k, then splitmix64's finalizer (FNV alone
// spreads ids that differ in one digit almost evenly).
uint64_t Hash(absl::string_view id, int k) {
  uint64_t h = 1469598103934665603ull;
  const auto mix = [&h](unsigned char c) {
    h ^= c;
    h *= 1099511628211ull;
  };
  for (char c : id) mix(static_cast<unsigned char>(c));
  for (int i = 0; i < 4; ++i) mix(static_cast<unsigned char>(k >> (8 * i)));
  h += 0x9e3779b97f4a7c15ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

// Whether a stream was cancelled (by its client or the server stopping).
class CallState {
 public:
  void Cancel() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  // Waits until `t`; true if cancelled first.
  bool CancelledBefore(absl::Time t) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithDeadline(absl::Condition(&cancelled_), t);
  }

 private:
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

int CountWords(absl::string_view text) {
  return static_cast<int>(
      std::vector<absl::string_view>(
          absl::StrSplit(text, absl::ByAnyChar(" \t\n"), absl::SkipEmpty()))
          .size());
}

}  // namespace

class StubServer::Service final : public v1::Baton::CallbackService {
 public:
  explicit Service(StubServerOptions options) : options_(std::move(options)) {}

  ~Service() override { Stop(); }

  // Cancels every running stream, joins its producer, and fails later
  // Generate calls with UNAVAILABLE.
  void Stop() {
    std::vector<std::thread> threads;
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      for (auto& state : states_) state->Cancel();
      threads = std::move(threads_);
    }
    for (std::thread& t : threads) t.join();
  }

  int calls() const { return calls_.load(); }

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* /*context*/,
      const v1::GenerateRequest* request) override {
    const absl::Time arrival = absl::Now();
    const int call = ++calls_;
    auto* reactor = new StreamReactor<v1::GenerateResponse>();
    const bool fail =
        options_.fail_code != grpc::StatusCode::OK &&
        (options_.fail_every <= 0 || call % options_.fail_every == 0);
    if (fail && !options_.fail_in_band) {
      reactor->Close(grpc::Status(options_.fail_code, "injected failure"));
      return reactor;
    }
    auto state = std::make_shared<CallState>();
    reactor->SetOnCancel([state] { state->Cancel(); });
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      reactor->Close(grpc::Status(grpc::StatusCode::UNAVAILABLE, "stopping"));
      return reactor;
    }
    states_.push_back(state);
    threads_.emplace_back([this, reactor, state, arrival, fail,
                           id = request->request_id(),
                           n = request->sampling().max_tokens()] {
      Produce(reactor, *state, arrival, id, n, fail);
    });
    return reactor;
  }

  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override {
    // Text: one token per word; a chat: its words plus 3 template tokens.
    int n = 0;
    if (request->has_chat()) {
      for (const auto& m : request->chat().messages()) {
        n += CountWords(m.content());
      }
      n += 3;
    } else {
      n = CountWords(request->text());
    }
    for (int i = 0; i < n; ++i) response->add_token_ids(1000 + i);
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* ListModels(
      grpc::CallbackServerContext* context,
      const v1::ListModelsRequest* /*request*/,
      v1::ListModelsResponse* response) override {
    v1::ModelInfo* m = response->add_models();
    m->set_id(options_.model_id);
    m->set_vocab_size(options_.vocab_size);
    m->set_colocated_workers(1);
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  void Produce(StreamReactor<v1::GenerateResponse>* reactor, CallState& state,
               absl::Time arrival, const std::string& id, int n, bool fail) {
    absl::Time due = arrival;
    for (int k = 0; k < n; ++k) {
      due += absl::Milliseconds(DelayMs(options_, id, k));
      if (state.CancelledBefore(due)) {
        reactor->Close(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
        return;
      }
      v1::GenerateResponse response;
      if (k == 0) response.set_request_id(id);
      response.add_token_ids(1000 + k % 1000);
      const bool last = k == n - 1 || fail;
      if (last) {
        response.set_request_id(id);
        v1::GenerateResult* result = response.mutable_result();
        result->mutable_usage()->set_prompt_tokens(7);
        result->mutable_usage()->set_completion_tokens(k + 1);
        if (fail) {
          result->set_finish_reason(v1::FINISH_REASON_ERROR);
          result->set_error_code(static_cast<int>(options_.fail_code));
          result->set_error_message("injected in-band failure");
        } else {
          result->set_finish_reason(v1::FINISH_REASON_LENGTH);
        }
      }
      reactor->Push(std::move(response));
      if (last) break;
    }
    reactor->Close(grpc::Status::OK);
  }

  const StubServerOptions options_;
  std::atomic<int> calls_{0};
  absl::Mutex mu_;
  std::vector<std::shared_ptr<CallState>> states_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

double StubServer::DelayMs(const StubServerOptions& options,
                           absl::string_view request_id, int k) {
  const double base =
      k == 0 ? options.first_token_delay_ms : options.token_delay_ms;
  const double jitter =
      k == 0 ? options.first_token_jitter_ms : options.token_jitter_ms;
  if (jitter <= 0) return base;
  const double u = (Hash(request_id, k) >> 11) * 0x1.0p-53;  // [0, 1)
  return base + jitter * (2 * u - 1);
}

absl::StatusOr<std::unique_ptr<StubServer>> StubServer::Start(
    const StubServerOptions& options) {
  std::unique_ptr<StubServer> stub(new StubServer());
  stub->service_ = std::make_unique<Service>(options);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(stub->service_.get());
  stub->server_ = builder.BuildAndStart();
  if (stub->server_ == nullptr || port == 0) {
    return absl::UnavailableError("stub server: cannot listen on 127.0.0.1");
  }
  stub->address_ = absl::StrCat("127.0.0.1:", port);
  return stub;
}

StubServer::~StubServer() {
  if (server_ != nullptr) {
    service_->Stop();
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(1));
    server_->Wait();
  }
}

int StubServer::generate_calls() const { return service_->calls(); }

}  // namespace baton::bench
