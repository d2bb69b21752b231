// A server-streaming reactor fed from any thread: a producer (the engine
// thread, a KV receiver thread) Push()es messages and Close()s the stream
// once; gRPC writes them one at a time in order. The reactor has two
// owners, gRPC (until OnDone) and the producer (until Close), and deletes
// itself when both have let go, so a producer may call Push/Close after the
// client went away (the messages are dropped).
#ifndef BATON_COMMON_GRPC_STREAM_REACTOR_H_
#define BATON_COMMON_GRPC_STREAM_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <functional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace baton {

template <typename Response>
class StreamReactor final : public grpc::ServerWriteReactor<Response> {
 public:
  // on_cancel runs (once, on a gRPC thread) if the client cancels or the
  // deadline expires before the stream was closed.
  explicit StreamReactor(std::function<void()> on_cancel = nullptr)
      : on_cancel_(std::move(on_cancel)) {}

  void SetOnCancel(std::function<void()> on_cancel) {
    absl::MutexLock lock(&mu_);
    on_cancel_ = std::move(on_cancel);
  }

  // Queues one message; dropped after Close or once the RPC is over.
  void Push(Response response) {
    absl::MutexLock lock(&mu_);
    if (closed_ || finished_) return;
    queue_.push_back(std::move(response));
    MaybeWriteLocked();
  }

  // Ends the stream with `status` once the queued messages are written,
  // and releases the producer's ownership: the producer must not touch the
  // reactor afterwards. Call exactly once.
  void Close(grpc::Status status) {
    bool release;
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
      status_ = std::move(status);
      MaybeWriteLocked();
      release = ReleaseLocked();
    }
    if (release) delete this;
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED,
                                "stream write failed (client gone)"));
      return;
    }
    queue_.pop_front();
    MaybeWriteLocked();
  }

  void OnCancel() override {
    std::function<void()> on_cancel;
    {
      absl::MutexLock lock(&mu_);
      if (!closed_) on_cancel = std::move(on_cancel_);
      on_cancel_ = nullptr;
      if (!writing_) {
        FinishLocked(
            grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by client"));
      }
    }
    if (on_cancel) on_cancel();
  }

  void OnDone() override {
    bool release;
    {
      absl::MutexLock lock(&mu_);
      grpc_done_ = true;
      release = ReleaseLocked();
    }
    if (release) delete this;
  }

 private:
  void MaybeWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_) return;
    if (!queue_.empty()) {
      writing_ = true;
      this->StartWrite(&queue_.front());
      return;
    }
    if (closed_) FinishLocked(status_);
  }

  void FinishLocked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    this->Finish(std::move(status));
  }

  // True when both owners have let go.
  bool ReleaseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (released_ || !grpc_done_ || !closed_) return false;
    released_ = true;
    return true;
  }

  absl::Mutex mu_;
  std::function<void()> on_cancel_ ABSL_GUARDED_BY(mu_);
  std::deque<Response> queue_ ABSL_GUARDED_BY(mu_);  // front is in flight
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;    // producer let go
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish called
  bool grpc_done_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace baton

#endif  // BATON_COMMON_GRPC_STREAM_REACTOR_H_
