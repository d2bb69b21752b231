// Fault injection for tests of the device-fault path (baton-worker
// --fault_after_steps): wraps an engine's runner and, from its N-th Forward
// on, fails every step with Internal and reports itself unhealthy, as a
// runner whose device faulted does.
#ifndef BATON_WORKER_ENGINE_FAULT_INJECTING_RUNNER_H_
#define BATON_WORKER_ENGINE_FAULT_INJECTING_RUNNER_H_

#include <cstdint>

#include "worker/engine/forward_runner.h"

namespace baton {

// make_runner (null: the CPU ModelRunner) wrapped so that Forward call
// `fail_from_step` (1-based) and every later one fail; the rest of the
// runner's interface passes through.
ForwardRunnerFactory FaultInjectingRunnerFactory(
    ForwardRunnerFactory make_runner, int64_t fail_from_step);

}  // namespace baton

#endif  // BATON_WORKER_ENGINE_FAULT_INJECTING_RUNNER_H_
