#include "worker/engine/fault_injecting_runner.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "worker/engine/model_runner.h"

namespace baton {
namespace {

class FaultInjectingRunner : public ForwardRunner {
 public:
  FaultInjectingRunner(std::unique_ptr<ForwardRunner> inner,
                       int64_t fail_from_step)
      : inner_(std::move(inner)), fail_from_step_(fail_from_step) {}

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
    return inner_->Forward(items, logits, on_layer_done);
  }
  absl::Status health() const override {
    absl::MutexLock lock(&mu_);
    if (!fault_.ok()) return fault_;
    return inner_->health();
  }
  std::string device_name() const override { return inner_->device_name(); }
  absl::Status CopyLayerToHost(int64_t layer,
                               std::span<const KvStagingCopy> copies) override {
    return inner_->CopyLayerToHost(layer, copies);
  }
  absl::Status CopyToDevice(const KvStagingCopy& copy) override {
    return inner_->CopyToDevice(copy);
  }
  uint8_t* device_kv_pool() const override { return inner_->device_kv_pool(); }
  KvCache* host_staging() override { return inner_->host_staging(); }
  bool reads_host_kv() const override { return inner_->reads_host_kv(); }

 private:
  const std::unique_ptr<ForwardRunner> inner_;
  const int64_t fail_from_step_;
  int64_t steps_ = 0;  // the engine thread's
  mutable absl::Mutex mu_;
  absl::Status fault_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

ForwardRunnerFactory FaultInjectingRunnerFactory(
    ForwardRunnerFactory make_runner, int64_t fail_from_step) {
  return [make_runner = std::move(make_runner), fail_from_step](
             const ModelWeights* weights, KvCache* cache, ThreadPool* pool)
             -> absl::StatusOr<std::unique_ptr<ForwardRunner>> {
    std::unique_ptr<ForwardRunner> inner;
    if (make_runner) {
      BATON_ASSIGN_OR_RETURN(inner, make_runner(weights, cache, pool));
    } else {
      BATON_ASSIGN_OR_RETURN(inner, ModelRunner::Create(weights, cache, pool));
    }
    return std::unique_ptr<ForwardRunner>(
        std::make_unique<FaultInjectingRunner>(std::move(inner),
                                               fail_from_step));
  };
}

}  // namespace baton
