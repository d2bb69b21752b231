// Step traces (baton-worker --step_trace=FILE): wraps an engine's runner and
// writes one JSON line per forward pass, to check a cost profile against the
// steps a loaded worker really takes (scripts/step_costs.py):
//
//   {"start":S,"seconds":D,"ok":true,"items":[[P,N,L],...]}
//
// S: when the pass began, in seconds on the host's monotonic clock (the
// same clock in every process of the host, so the traces of workers that
// share it line up); D: how long it took, the KV handoff work the engine
// does between layers included; one item per sequence in the batch: P
// tokens already cached, N tokens fed, L its logits (0: none, a prefill
// chunk that is not the prompt's last; 1: the last token's, a decode or a
// prompt's last chunk; 2: every token's).
#ifndef BATON_WORKER_ENGINE_STEP_TRACE_RUNNER_H_
#define BATON_WORKER_ENGINE_STEP_TRACE_RUNNER_H_

#include <string>

#include "worker/engine/forward_runner.h"

namespace baton {

// make_runner (null: the CPU ModelRunner) wrapped so that every Forward
// appends its line to `path`, which the runner's creation truncates (an
// error naming the file if it cannot be opened).
ForwardRunnerFactory StepTraceRunnerFactory(ForwardRunnerFactory make_runner,
                                            std::string path);

}  // namespace baton

#endif  // BATON_WORKER_ENGINE_STEP_TRACE_RUNNER_H_
