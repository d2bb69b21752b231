#include "worker/engine/fault_injecting_runner.h"

#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "worker/engine/wrapped_runner.h"

namespace baton {
namespace {

class FaultInjectingRunner : public WrappedRunner {
 public:
  FaultInjectingRunner(std::unique_ptr<ForwardRunner> inner,
                       int64_t fail_from_step)
      : WrappedRunner(std::move(inner)), fail_from_step_(fail_from_step) {}

  absl::Status Forward(std::span<const ForwardItem> items,
                       std::vector<float>* logits,
                       const LayerDoneFn& on_layer_done) override {
    if (++steps_ >= fail_from_step_) {
      absl::MutexLock lock(&mu_);
      if (fault_.ok()) {
        fault_ =
            absl::InternalError(absl::StrCat("injected device fault at step ",
                                             steps_, " (--fault_after_steps)"));
      }
      return fault_;
    }
    return inner().Forward(items, logits, on_layer_done);
  }
  absl::Status health() const override {
    absl::MutexLock lock(&mu_);
    if (!fault_.ok()) return fault_;
    return inner().health();
  }

 private:
  const int64_t fail_from_step_;
  int64_t steps_ = 0;  // the engine thread's
  mutable absl::Mutex mu_;
  absl::Status fault_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

ForwardRunnerFactory FaultInjectingRunnerFactory(
    ForwardRunnerFactory make_runner, int64_t fail_from_step) {
  return WrapRunnerFactory(
      std::move(make_runner),
      [fail_from_step](std::unique_ptr<ForwardRunner> inner)
          -> absl::StatusOr<std::unique_ptr<ForwardRunner>> {
        return std::make_unique<FaultInjectingRunner>(std::move(inner),
                                                      fail_from_step);
      });
}

}  // namespace baton
