// A runner that computes nothing, for control-plane load on the real
// coordinator and workers (baton-worker --engine=simulated --profile=FILE):
// each Forward sleeps for the time a cost profile predicts for its batch
// (prefill items: the uncached prompt tokens of each; decode items: one
// token each, at its context), releasing the layers at an even pace so KV
// handoffs stream as they would (in slices of at least 1 ms: one wake-up per
// layer would cost more than a short step), and writes logits whose largest
// entry is SimulatedToken of the item's position and last token. The engine,
// its scheduler, KV accounting, sampling and transports run as usual; the KV
// blocks hold whatever the pool held (no model state is computed).
#ifndef BATON_WORKER_ENGINE_SIMULATED_RUNNER_H_
#define BATON_WORKER_ENGINE_SIMULATED_RUNNER_H_

#include <cstdint>

#include "worker/engine/cost_profile.h"
#include "worker/engine/forward_runner.h"
#include "worker/engine/kv_sink.h"

namespace baton {

ForwardRunnerFactory SimulatedRunnerFactory(WorkerProfile profile);

// Simulated KV transfers (baton-worker --simulate_kv_transfers): sinks from
// `inner` (a TcpKvSender with simulated_layers, which moves no bytes) whose
// Finish returns no earlier than the profile's transfer time of the tokens
// the handoff carries (TransferSeconds, from the tokens after first_block),
// counted from when the handoff opened its sink, as the prefill started:
// the destination sees the last layer land when the modelled link would
// have delivered it.
KvSinkFactory SimulatedTransferSinkFactory(KvSinkFactory inner,
                                           WorkerProfile profile);

// The token the simulated model prefers after `last_token` at `position`:
// a mix of both, in the upper three quarters of the vocabulary (clear of
// the special and byte tokens at its start).
int32_t SimulatedToken(int64_t position, int32_t last_token,
                       int64_t vocab_size);

}  // namespace baton

#endif  // BATON_WORKER_ENGINE_SIMULATED_RUNNER_H_
