// Awaitable gRPC client calls over the callback API, for coroutines
// (common/async/task.h) that must not hold a thread while an RPC runs:
//
//   grpc::Status s = co_await Unary(executor, [&](auto* reactor) {
//     stub->async()->ReserveKv(&context, &request, &response, reactor);
//   });
//
//   auto reader = std::make_shared<StreamReader<Request, Response>>(executor);
//   reader->context()->set_deadline(...);
//   *reader->request() = ...;
//   stub->async()->Prefill(reader->context(), reader->request(), reader.get());
//   reader->Start();
//   while (co_await reader->Read(&message)) ...
//   grpc::Status status = co_await reader->Finish();
//
// The coroutine resumes on the executor's threads, except after
// ReadInline's messages: a loop that only forwards what it reads resumes on
// the gRPC thread that completed the read, which saves a thread hand-off
// (a wake-up and a context switch) per message. Code after such a read must
// not block, as any gRPC reaction; the end of the stream (false) resumes on
// the executor as a Read's does.
// A StreamReader left before Finish (an early return) is cancelled and ends
// on its own; it lives until gRPC is done with it. Debian's gRPC is not
// built for TSan, so each hand-off to and from gRPC is annotated.
#ifndef BATON_COMMON_GRPC_ASYNC_CALL_H_
#define BATON_COMMON_GRPC_ASYNC_CALL_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_callback.h>

#include <chrono>
#include <coroutine>
#include <functional>
#include <memory>
#include <utility>

#include "common/async/executor.h"
#include "common/tsan/annotations.h"

namespace baton::async {

// co_await Unary(executor, start): `start(reactor)` names the reactor in a
// unary callback RPC (stub->async()->Method(context, request, response,
// reactor)); the awaiter starts the call, and the result is its status.
// Everything the RPC uses (context, request, response) must outlive the
// co_await, as locals of the awaiting coroutine do.
// With `completed_at`, the time the reply arrived (on the gRPC thread, before
// the hand-off to the executor) is written there.
// The awaiter is the call's reactor: gRPC's OnDone is a virtual call on an
// object written before the release, where a std::function callback would
// hand gRPC's thread a closure copied after it.
template <typename Start>
class Unary final : public ::grpc::ClientUnaryReactor {
 public:
  Unary(Executor* executor, Start start,
        std::chrono::steady_clock::time_point* completed_at = nullptr)
      : executor_(executor),
        start_(std::move(start)),
        completed_at_(completed_at) {}

  bool await_ready() const noexcept { return false; }
  bool await_suspend(std::coroutine_handle<> awaiter) {
    awaiter_ = awaiter;
    start_(static_cast<::grpc::ClientUnaryReactor*>(this));
    // After start_, which built gRPC's call object on this thread: its
    // first reaction on a gRPC thread (below) then sees that construction.
    BATON_TSAN_RELEASE(this);
    StartCall();
    return !done_.Arrive();
  }
  ::grpc::Status await_resume() { return std::move(status_); }

  // gRPC's start reaction calls this before it counts down the call's
  // outstanding callbacks, an access to the object built in await_suspend.
  void OnReadInitialMetadataDone(bool /*ok*/) override {
    BATON_TSAN_ACQUIRE(this);
  }

  // gRPC's last reaction: nothing of the call is touched after it.
  void OnDone(const ::grpc::Status& status) override {
    BATON_TSAN_ACQUIRE(this);
    if (completed_at_ != nullptr) {
      *completed_at_ = std::chrono::steady_clock::now();
    }
    status_ = status;
    Executor* const executor = executor_;
    const std::coroutine_handle<> awaiter = awaiter_;
    if (done_.Arrive()) executor->Resume(awaiter);
  }

 private:
  Executor* const executor_;
  Start start_;
  std::chrono::steady_clock::time_point* const completed_at_;
  std::coroutine_handle<> awaiter_;
  ::grpc::Status status_;
  Rendezvous done_;
};

// A server-streaming call read by a coroutine, one message per co_await.
template <typename Request, typename Response>
class StreamReader final
    : public ::grpc::ClientReadReactor<Response>,
      public std::enable_shared_from_this<StreamReader<Request, Response>> {
 public:
  explicit StreamReader(Executor* executor) : executor_(executor) {}
  ~StreamReader() override = default;

  ::grpc::ClientContext* context() { return &context_; }
  Request* request() { return &request_; }

  // After the stub's async() call named this reactor: starts the call. The
  // reader keeps itself alive until gRPC is done with it.
  void Start() {
    self_ = this->shared_from_this();
    // Reads start from the coroutine, outside gRPC's reactions: the hold
    // keeps the call from ending between them (released by Finish or
    // Abandon).
    this->AddHold();
    started_ = true;
    BATON_TSAN_RELEASE(this);
    this->StartCall();
  }

  class ReadAwaiter {
   public:
    ReadAwaiter(StreamReader* reader, Response* out, bool inline_message)
        : reader_(reader), out_(out), inline_message_(inline_message) {}
    bool await_ready() const noexcept { return false; }
    bool await_suspend(std::coroutine_handle<> awaiter) {
      StreamReader* r = reader_;
      r->read_waiter_ = awaiter;
      r->read_inline_ = inline_message_;
      r->read_done_.Reset();
      BATON_TSAN_RELEASE(r);
      r->StartRead(out_);
      return !r->read_done_.Arrive();
    }
    bool await_resume() const { return reader_->read_ok_; }

   private:
    StreamReader* reader_;
    Response* out_;
    bool inline_message_;
  };
  // co_await: true with the next message in *out, false at the end of the
  // stream (then Finish). REQUIRES: Start, no Read pending, not finished.
  ReadAwaiter Read(Response* out) { return ReadAwaiter(this, out, false); }
  // As Read, but a message resumes the coroutine on the gRPC thread that
  // read it (see the top of this file).
  ReadAwaiter ReadInline(Response* out) { return ReadAwaiter(this, out, true); }

  class FinishAwaiter {
   public:
    explicit FinishAwaiter(StreamReader* reader) : reader_(reader) {}
    bool await_ready() const noexcept { return false; }
    bool await_suspend(std::coroutine_handle<> awaiter) {
      StreamReader* r = reader_;
      r->finish_waiter_ = awaiter;
      BATON_TSAN_RELEASE(r);
      r->ReleaseHold();
      return !r->finish_done_.Arrive();
    }
    ::grpc::Status await_resume() const { return reader_->status_; }

   private:
    StreamReader* reader_;
  };
  // co_await: the call's status, once gRPC is done with it. Call once, and
  // not after Abandon. REQUIRES: Start.
  FinishAwaiter Finish() { return FinishAwaiter(this); }

  // Leaves the call without finishing it: cancels it; it ends on its own.
  // REQUIRES: no Read pending.
  void Abandon() {
    if (!started_) return;
    context_.TryCancel();
    ReleaseHold();
  }

  void OnReadInitialMetadataDone(bool) override {
    BATON_TSAN_ACQUIRE(this);  // the first reaction, on a gRPC thread
  }

  void OnReadDone(bool ok) override {
    BATON_TSAN_ACQUIRE(this);
    read_ok_ = ok;
    // Read before the rendezvous: the coroutine, once past it, may start
    // the next read.
    const bool resume_here = ok && read_inline_;
    if (!read_done_.Arrive()) return;
    if (resume_here) {
      read_waiter_.resume();
    } else {
      executor_->Resume(read_waiter_);
    }
  }

  void OnDone(const ::grpc::Status& status) override {
    BATON_TSAN_ACQUIRE(this);
    status_ = status;
    // gRPC is done with the reactor; the coroutine may still hold it.
    std::shared_ptr<StreamReader> self = std::move(self_);
    if (finish_done_.Arrive()) executor_->Resume(finish_waiter_);
  }

 private:
  void ReleaseHold() {
    if (hold_released_) return;
    hold_released_ = true;
    this->RemoveHold();
  }

  Executor* const executor_;
  ::grpc::ClientContext context_;
  Request request_;
  // Written before the operation that reads them starts, read by its
  // completion (or by the coroutine after the rendezvous).
  std::shared_ptr<StreamReader> self_;  // until OnDone
  std::coroutine_handle<> read_waiter_;
  std::coroutine_handle<> finish_waiter_;
  bool read_ok_ = false;
  bool read_inline_ = false;
  ::grpc::Status status_;
  Rendezvous read_done_;
  Rendezvous finish_done_;
  bool started_ = false;        // the coroutine's own
  bool hold_released_ = false;  // idem
};

// Leaves `reader` (Abandon) when the scope ends without Finish: an early
// return from the coroutine cancels the stream.
template <typename Reader>
class AbandonOnExit {
 public:
  explicit AbandonOnExit(Reader* reader) : reader_(reader) {}
  ~AbandonOnExit() {
    if (reader_ != nullptr) reader_->Abandon();
  }
  void Release() { reader_ = nullptr; }
  AbandonOnExit(const AbandonOnExit&) = delete;
  AbandonOnExit& operator=(const AbandonOnExit&) = delete;

 private:
  Reader* reader_;
};

}  // namespace baton::async

#endif  // BATON_COMMON_GRPC_ASYNC_CALL_H_
