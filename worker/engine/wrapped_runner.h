// Decorators of an engine's runner (fault injection, step traces): each
// wraps the runner the engine would have used and passes through what it
// does not change.
#ifndef BATON_WORKER_ENGINE_WRAPPED_RUNNER_H_
#define BATON_WORKER_ENGINE_WRAPPED_RUNNER_H_

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "worker/engine/forward_runner.h"

namespace baton {

// Every call goes to the wrapped runner; a decorator overrides the ones it
// changes.
class WrappedRunner : public ForwardRunner {
 public:
  explicit WrappedRunner(std::unique_ptr<ForwardRunner> inner)
      : inner_(std::move(inner)) {}

  absl::Status Forward(std::span<const ForwardItem> items,
                       std::vector<float>* logits,
                       const LayerDoneFn& on_layer_done) override {
    return inner_->Forward(items, logits, on_layer_done);
  }
  absl::Status health() const override { return inner_->health(); }
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

 protected:
  ForwardRunner& inner() const { return *inner_; }

 private:
  const std::unique_ptr<ForwardRunner> inner_;
};

// Builds the runner make_runner builds (null: the CPU ModelRunner) and
// returns wrap(it), or wrap's error.
using RunnerWrapper =
    std::function<absl::StatusOr<std::unique_ptr<ForwardRunner>>(
        std::unique_ptr<ForwardRunner> inner)>;
ForwardRunnerFactory WrapRunnerFactory(ForwardRunnerFactory make_runner,
                                       RunnerWrapper wrap);

}  // namespace baton

#endif  // BATON_WORKER_ENGINE_WRAPPED_RUNNER_H_
