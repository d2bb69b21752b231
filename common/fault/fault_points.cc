#include "common/fault/fault_points.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace baton {

const std::vector<absl::string_view>& KnownFaultPoints() {
  static const std::vector<absl::string_view> points = {
      kFaultPrefillStep,   kFaultDecodeStep,      kFaultKvLayerSent,
      kFaultKvReserved,    kFaultKvImportStarted, kFaultKvLayerImported,
      kFaultKvLayerCorrupt};
  return points;
}

namespace {

absl::StatusOr<FaultAction> ParseAction(absl::string_view action) {
  if (action == "crash") return FaultAction::kCrash;
  if (action == "stop") return FaultAction::kStop;
  if (action == "error") return FaultAction::kError;
  if (action == "hang") return FaultAction::kHang;
  return absl::InvalidArgumentError(absl::StrCat(
      "fault action '", action, "' is not one of crash, stop, error, hang"));
}

}  // namespace

absl::StatusOr<std::vector<FaultSpec>> ParseFaultSpecs(absl::string_view spec) {
  std::vector<FaultSpec> specs;
  if (spec.empty()) return specs;
  for (absl::string_view part : absl::StrSplit(spec, ',')) {
    const std::vector<absl::string_view> fields = absl::StrSplit(part, ':');
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("fault '", part, "' is not POINT:ACTION[@N]"));
    }
    FaultSpec parsed;
    parsed.point = std::string(fields[0]);
    const auto& known = KnownFaultPoints();
    if (std::find(known.begin(), known.end(), fields[0]) == known.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("fault point '", fields[0], "' is not one of ",
                       absl::StrJoin(known, ", ")));
    }
    absl::string_view action = fields[1];
    if (const size_t at = action.find('@'); at != absl::string_view::npos) {
      if (!absl::SimpleAtoi(action.substr(at + 1), &parsed.hit) ||
          parsed.hit < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("fault '", part,
                         "': the hit after '@' must be an "
                         "integer >= 1"));
      }
      action = action.substr(0, at);
    }
    auto parsed_action = ParseAction(action);
    if (!parsed_action.ok()) return parsed_action.status();
    parsed.action = *parsed_action;
    specs.push_back(std::move(parsed));
  }
  return specs;
}

FaultPoints& FaultPoints::Global() {
  static FaultPoints* points = new FaultPoints();
  return *points;
}

void FaultPoints::Arm(std::vector<FaultSpec> specs) {
  absl::MutexLock lock(&mu_);
  faults_.clear();
  for (FaultSpec& spec : specs) faults_.push_back(Armed{std::move(spec)});
  armed_.store(!faults_.empty(), std::memory_order_relaxed);
}

absl::Status FaultPoints::Hit(absl::string_view point) {
  if (!armed_.load(std::memory_order_relaxed)) return absl::OkStatus();
  FaultAction action;
  int64_t hit = 0;
  {
    absl::MutexLock lock(&mu_);
    Armed* fires = nullptr;
    for (Armed& armed : faults_) {
      if (armed.spec.point != point || armed.fired) continue;
      if (++armed.hits == armed.spec.hit && fires == nullptr) {
        armed.fired = true;
        fires = &armed;
      }
    }
    if (fires == nullptr) return absl::OkStatus();
    action = fires->spec.action;
    hit = fires->hits;
  }
  // What the process does, on stderr first: the test that started it reads
  // it there.
  auto announce = [&](const char* what) {
    std::fprintf(stderr, "fault point %.*s: %s (hit %lld)\n",
                 static_cast<int>(point.size()), point.data(), what,
                 static_cast<long long>(hit));
    std::fflush(stderr);
  };
  switch (action) {
    case FaultAction::kCrash:
      announce("crashing");
      raise(SIGKILL);
      _exit(137);  // not reached
    case FaultAction::kStop:
      announce("stopped");
      raise(SIGSTOP);
      return absl::OkStatus();
    case FaultAction::kHang:
      announce("hung");
      for (;;) pause();  // only a signal's default action ends this
    case FaultAction::kError:
      announce("failing");
      break;
  }
  return absl::InternalError(
      absl::StrCat("injected fault at ", point, " (hit ", hit, ", --fault)"));
}

}  // namespace baton
