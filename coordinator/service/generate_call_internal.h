// Pieces of GenerateCall shared by its two source files (generate_call.cc:
// the request's life; generate_route.cc: picking and reserving workers).
#ifndef BATON_COORDINATOR_SERVICE_GENERATE_CALL_INTERNAL_H_
#define BATON_COORDINATOR_SERVICE_GENERATE_CALL_INTERNAL_H_

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <coroutine>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/async/executor.h"
#include "coordinator/service/generate_call.h"
#include "coordinator/worker_rpc.h"

namespace baton::coordinator {

// `status` of a worker RPC as an absl::Status, its code kept, naming the RPC
// and the worker, with the RPC as its kWorkerRpcPayload.
inline absl::Status WorkerError(const WorkerInfo& worker, WorkerRpc rpc,
                                const grpc::Status& status) {
  return TagWorkerRpc(
      absl::Status(
          static_cast<absl::StatusCode>(status.error_code()),
          absl::StrCat(WorkerRpcName(rpc), " on worker ", worker.ref.id, " (",
                       worker.registration.address,
                       "): ", status.error_message())),
      rpc);
}

using SteadyClock = std::chrono::steady_clock;

inline double MsBetween(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

inline v1::WorkerRef ToRef(const WorkerInfo& worker) {
  v1::WorkerRef ref;
  ref.set_worker_id(worker.ref.id);
  ref.set_address(worker.registration.address);
  return ref;
}

class GenerateCall::ScopedContext {
 public:
  ScopedContext(GenerateCall* call, grpc::ClientContext* context)
      : call_(call), context_(context) {
    absl::MutexLock lock(&call_->mu_);
    call_->contexts_.push_back(context_);
    if (!call_->abort_.ok()) context_->TryCancel();
  }
  ~ScopedContext() {
    absl::MutexLock lock(&call_->mu_);
    auto& v = call_->contexts_;
    v.erase(std::find(v.begin(), v.end(), context_));
  }

 private:
  GenerateCall* call_;
  grpc::ClientContext* context_;
};

// The KV target a reservation on `decode` names, for the prefill worker.
inline void FillKvTarget(const WorkerInfo& decode,
                         const v1::ReserveKvResponse& reserved,
                         v1::KvTarget* target) {
  *target->mutable_decode_worker() = ToRef(decode);
  *target->mutable_endpoint() = reserved.endpoint();
  *target->mutable_alternatives() = reserved.alternatives();
  target->set_transfer_id(reserved.transfer_id());
  target->set_transfer_secret(reserved.transfer_secret());
  target->set_first_block(reserved.cached_blocks());
}

// A decode reservation made beside the Prefill: ReserveKv on the decode
// worker, then SetKvTarget on the prefill worker. `status`, `reserved` and
// `reserve_ms` are final once an OverlapAwaiter resumes.
struct GenerateCall::Overlap {
  grpc::ClientContext reserve_context;
  grpc::ClientContext target_context;
  v1::ReserveKvRequest request;
  v1::ReserveKvResponse reserved;
  absl::Status status;
  double reserve_ms = 0;
  async::Rendezvous done;  // its end and an awaiter's suspension
  std::coroutine_handle<> waiter;
  // Ends its calls (the attempt ended without them). Thread-safe.
  void Cancel() {
    reserve_context.TryCancel();
    target_context.TryCancel();
  }
};

// co_await: until the reservation beside the Prefill has ended.
class GenerateCall::OverlapAwaiter {
 public:
  explicit OverlapAwaiter(Overlap* overlap) : overlap_(overlap) {}
  bool await_ready() const noexcept { return false; }
  bool await_suspend(std::coroutine_handle<> awaiter) {
    overlap_->waiter = awaiter;
    return !overlap_->done.Arrive();
  }
  void await_resume() const {}

 private:
  Overlap* overlap_;
};

// Suspends the call's coroutine for up to `delay` on the executor's timer;
// an abort of the call or its attempt (Abort) fires the timer at once.
class GenerateCall::BackoffAwaiter {
 public:
  BackoffAwaiter(GenerateCall* call, absl::Duration delay)
      : call_(call), delay_(delay) {}
  bool await_ready() const noexcept { return false; }
  bool await_suspend(std::coroutine_handle<> awaiter) {
    async::Executor& executor = call_->cluster_->executor();
    const uint64_t timer = executor.After(delay_, [this, awaiter] {
      if (fired_.Arrive()) awaiter.resume();
    });
    bool aborted;
    {
      absl::MutexLock lock(&call_->mu_);
      aborted = !call_->abort_.ok() || !call_->attempt_abort_.ok();
      if (!aborted) call_->backoff_timer_ = timer;
    }
    if (aborted) executor.Fire(timer);
    return !fired_.Arrive();
  }
  bool await_resume() {
    absl::MutexLock lock(&call_->mu_);
    call_->backoff_timer_ = 0;
    return call_->abort_.ok() && call_->attempt_abort_.ok();
  }

 private:
  GenerateCall* call_;
  absl::Duration delay_;
  async::Rendezvous fired_;  // the timer's run and await_suspend's end
};

}  // namespace baton::coordinator

#endif  // BATON_COORDINATOR_SERVICE_GENERATE_CALL_INTERNAL_H_
