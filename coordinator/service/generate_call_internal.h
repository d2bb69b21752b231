// Pieces of GenerateCall shared by its two source files (generate_call.cc:
// the request's life; generate_route.cc: picking and reserving workers).
#ifndef BATON_COORDINATOR_SERVICE_GENERATE_CALL_INTERNAL_H_
#define BATON_COORDINATOR_SERVICE_GENERATE_CALL_INTERNAL_H_

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "coordinator/service/generate_call.h"

namespace baton::coordinator {

// `status` of a worker RPC as an absl::Status, its code kept, naming the RPC
// and the worker.
inline absl::Status WorkerError(const WorkerInfo& worker, absl::string_view rpc,
                                const grpc::Status& status) {
  return absl::Status(
      static_cast<absl::StatusCode>(status.error_code()),
      absl::StrCat(rpc, " on worker ", worker.ref.id, " (",
                   worker.registration.address, "): ", status.error_message()));
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

}  // namespace baton::coordinator

#endif  // BATON_COORDINATOR_SERVICE_GENERATE_CALL_INTERNAL_H_
