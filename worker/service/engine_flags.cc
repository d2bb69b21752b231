#include "worker/service/engine_flags.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "worker/engine/cost_profile.h"
#include "worker/engine/fault_injecting_runner.h"
#include "worker/engine/simulated_runner.h"
#include "worker/engine/step_trace_runner.h"

ABSL_FLAG(std::string, engine, "cpu",
          "cpu: compute with the model; simulated: compute nothing and take "
          "the time --profile predicts for each step (control-plane load "
          "tests)");
ABSL_FLAG(int64_t, fault_after_steps, 0,
          "fault injection for tests: the engine's runner fails every step "
          "from this one on (the warm-up's steps count), as after a device "
          "fault; 0: off");
ABSL_FLAG(std::string, step_trace, "",
          "write one JSON line per engine step to this file (when it began, "
          "how long it took, each sequence's cached and fed tokens), to check "
          "a cost profile against a loaded worker's steps "
          "(scripts/step_costs.py); empty: off");
ABSL_FLAG(std::string, profile, "",
          "with --engine=simulated: the cost profile (JSON, as baton-sim "
          "reads; e.g. from baton-bench profile)");
ABSL_FLAG(bool, kv_prefault, false,
          "commit the whole host KV pool at start (a CPU worker's memory up "
          "front), so no request waits for the page faults of the blocks it "
          "is first to use; not with --device=cuda:N (its pool is on the "
          "GPU)");

ABSL_FLAG(bool, simulate_kv_transfers, false,
          "with --engine=simulated: KV handoffs carry no bytes (the "
          "receiver counts each layer landed) and take the time --profile's "
          "transfer model predicts; every worker of the cluster needs it");

namespace baton {

namespace {

absl::Status ApplySimulatedEngine(
    bool on_device, EngineOptions* options,
    std::optional<WorkerProfile>* simulated_kv_transfers) {
  const bool simulate_kv = absl::GetFlag(FLAGS_simulate_kv_transfers);
  const std::string engine = absl::GetFlag(FLAGS_engine);
  if (engine == "cpu" && simulate_kv) {
    return absl::InvalidArgumentError(
        "--simulate_kv_transfers needs --engine=simulated (a computing "
        "engine's KV must travel)");
  }
  if (engine == "cpu") return absl::OkStatus();
  if (engine != "simulated") {
    return absl::InvalidArgumentError(
        absl::StrCat("--engine must be cpu or simulated, got '", engine, "'"));
  }
  if (on_device) {
    return absl::InvalidArgumentError(
        "--engine=simulated computes nothing: leave --device at cpu");
  }
  if (absl::GetFlag(FLAGS_profile).empty()) {
    return absl::InvalidArgumentError(
        "--engine=simulated needs --profile=FILE");
  }
  absl::StatusOr<WorkerProfile> profile =
      LoadProfile(absl::GetFlag(FLAGS_profile));
  if (!profile.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--profile: ", profile.status().message()));
  }
  if (simulate_kv) *simulated_kv_transfers = *profile;
  options->make_runner = SimulatedRunnerFactory(*std::move(profile));
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplyEngineFlags(
    bool on_device, EngineOptions* options,
    std::optional<WorkerProfile>* simulated_kv_transfers) {
  *simulated_kv_transfers = std::nullopt;
  if (absl::GetFlag(FLAGS_kv_prefault) && on_device) {
    return absl::InvalidArgumentError(
        "--kv_prefault commits a host KV pool; with --device=cuda:N the pool "
        "is on the GPU");
  }
  options->kv_prefault = absl::GetFlag(FLAGS_kv_prefault);
  if (absl::Status s =
          ApplySimulatedEngine(on_device, options, simulated_kv_transfers);
      !s.ok()) {
    return s;
  }
  if (absl::GetFlag(FLAGS_fault_after_steps) > 0) {
    options->make_runner =
        FaultInjectingRunnerFactory(std::move(options->make_runner),
                                    absl::GetFlag(FLAGS_fault_after_steps));
  }
  if (!absl::GetFlag(FLAGS_step_trace).empty()) {
    options->make_runner = StepTraceRunnerFactory(
        std::move(options->make_runner), absl::GetFlag(FLAGS_step_trace));
  }
  return absl::OkStatus();
}

}  // namespace baton
