// baton-worker --engine=cpu|simulated [--profile=FILE] and
// --fault_after_steps=N: what the engine's steps run on. `cpu` (the
// default) keeps the runner --device chose;
// `simulated` computes nothing and sleeps for the time the cost profile
// predicts (worker/engine/simulated_runner.h), so one machine can run dozens
// of workers against a real coordinator. --fault_after_steps wraps either in
// a runner that fails from its N-th step (tests of the device-fault path).
// --simulate_kv_transfers (with --engine=simulated) also takes the bytes out
// of KV handoffs: dozens of simulated workers would saturate loopback with
// real KV, and the profile's transfer model gives each handoff its time.
#ifndef BATON_WORKER_SERVICE_ENGINE_FLAGS_H_
#define BATON_WORKER_SERVICE_ENGINE_FLAGS_H_

#include <optional>

#include "absl/status/status.h"
#include "worker/engine/cost_profile.h"
#include "worker/engine/engine.h"

namespace baton {

// Applies --engine, --profile and --kv_prefault to `options` (after --device
// set its runner). InvalidArgument naming the flag for an unknown engine, a
// missing or bad profile, or a simulated engine or --kv_prefault on a
// device.
// Sets *simulated_kv_transfers to the profile whose transfer model paces
// this worker's KV handoffs, which then move no bytes, with
// --simulate_kv_transfers (nullopt without it); InvalidArgument naming the
// flag without --engine=simulated (a computing engine's KV must travel).
absl::Status ApplyEngineFlags(
    bool on_device, EngineOptions* options,
    std::optional<WorkerProfile>* simulated_kv_transfers);

}  // namespace baton

#endif  // BATON_WORKER_SERVICE_ENGINE_FLAGS_H_
