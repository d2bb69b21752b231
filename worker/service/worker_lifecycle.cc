#include "worker/service/worker_lifecycle.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/grpc/serving.h"
#include "common/status_macros.h"

namespace baton {
namespace {

void Log(const std::string& line) {
  std::fprintf(stderr, "baton-worker: %s\n", line.c_str());
}

}  // namespace

HealthWatch::HealthWatch(Engine* engine, HealthStatus* health)
    : engine_(engine), health_(health), thread_([this] { Run(); }) {}

HealthWatch::~HealthWatch() {
  stop_.Notify();
  thread_.join();
}

void HealthWatch::Run() {
  while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(250))) {
    if (absl::Status health = engine_->health(); !health.ok()) {
      health_->Set(false);
      Log(absl::StrCat("health: NOT_SERVING: ", health.ToString()));
      return;
    }
  }
}

void DrainWorker(int signal_number, absl::Duration timeout,
                 HealthStatus* health, WorkerService* service,
                 CoordinatorMembership* membership) {
  if (timeout <= absl::ZeroDuration()) {
    Log(absl::StrCat("signal ", signal_number, ", stopping"));
    return;
  }
  health->Set(false);
  if (membership != nullptr) membership->StartDraining();
  const absl::Time deadline = absl::Now() + timeout;
  auto in_flight = [&] {
    const size_t here = service->LeasedRequestIds().size();
    const bool there =
        membership != nullptr && membership->CoordinatorsHoldLeases();
    return here > 0 ? here : (there ? size_t{1} : size_t{0});
  };
  size_t pending = in_flight();
  Log(absl::StrCat("signal ", signal_number, ", draining for up to ",
                   absl::FormatDuration(timeout)));
  while (pending > 0) {
    const absl::Duration time_left = deadline - absl::Now();
    if (time_left <= absl::ZeroDuration()) {
      Log(absl::StrCat("drain timed out with ",
                       service->LeasedRequestIds().size(),
                       " request(s) in flight here; stopping"));
      return;
    }
    if (const int again = WaitForTerminationSignalFor(
            std::min(time_left, absl::Milliseconds(50)));
        again != 0) {
      Log(absl::StrCat("signal ", again, " during the drain; stopping"));
      return;
    }
    pending = in_flight();
  }
  Log("drained; stopping");
}

absl::Status WarmUp(Engine& engine) {
  GenerationRequest request;
  request.id = "warm-up";
  for (int32_t i = 0; i < 32; ++i) {
    request.prompt.push_back(i %
                             static_cast<int32_t>(engine.config().vocab_size));
  }
  request.params.temperature = 0.0;
  request.params.seed = 0;
  request.params.max_tokens = 2;
  request.params.ignore_eos = true;
  absl::Status result = absl::UnknownError("warm-up did not finish");
  BATON_RETURN_IF_ERROR(
      engine.Submit(request, [&result](const RequestOutput& out) {
        if (out.finish_reason == FinishReason::kError) {
          result = out.error;
        } else if (out.finish_reason != FinishReason::kNone) {
          result = absl::OkStatus();
        }
      }));
  engine.RunUntilIdle();
  engine.ResetPrefixCache();  // the warm-up's prompt is nobody's prefix
  return result;
}

}  // namespace baton
