#include "worker/engine/wrapped_runner.h"

#include <utility>

#include "common/status_macros.h"
#include "worker/engine/model_runner.h"

namespace baton {

ForwardRunnerFactory WrapRunnerFactory(ForwardRunnerFactory make_runner,
                                       RunnerWrapper wrap) {
  return [make_runner = std::move(make_runner), wrap = std::move(wrap)](
             const ModelWeights* weights, KvCache* cache, ThreadPool* pool)
             -> absl::StatusOr<std::unique_ptr<ForwardRunner>> {
    std::unique_ptr<ForwardRunner> inner;
    if (make_runner) {
      BATON_ASSIGN_OR_RETURN(inner, make_runner(weights, cache, pool));
    } else {
      BATON_ASSIGN_OR_RETURN(inner, ModelRunner::Create(weights, cache, pool));
    }
    return wrap(std::move(inner));
  };
}

}  // namespace baton
