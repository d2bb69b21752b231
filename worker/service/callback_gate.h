// A gate for callbacks that may fire after their target began to go away
// (gRPC's OnCancel can run on a gRPC thread while the service is being
// destroyed). The target holds the gate by shared_ptr and so does every
// callback; Close() waits for the callbacks inside it and turns every later
// one into a no-op, so none touches the target once Close() returns.
#ifndef BATON_WORKER_SERVICE_CALLBACK_GATE_H_
#define BATON_WORKER_SERVICE_CALLBACK_GATE_H_

#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace baton {

class CallbackGate {
 public:
  CallbackGate() = default;
  CallbackGate(const CallbackGate&) = delete;
  CallbackGate& operator=(const CallbackGate&) = delete;

  // Runs fn() unless the gate is closed; false if it did not run.
  template <typename F>
  bool Run(F&& fn) {
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return false;
      ++running_;
    }
    std::forward<F>(fn)();
    absl::MutexLock lock(&mu_);
    --running_;
    return true;
  }

  // Closes the gate and waits until no callback runs inside it.
  // REQUIRES: not called from inside Run.
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    mu_.Await(absl::Condition(
        +[](int* running) { return *running == 0; }, &running_));
  }

 private:
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace baton

#endif  // BATON_WORKER_SERVICE_CALLBACK_GATE_H_
