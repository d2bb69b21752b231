#include "coordinator/types.h"

#include "absl/strings/str_cat.h"

namespace baton::coordinator {

absl::string_view WorkerRoleName(WorkerRole role) {
  switch (role) {
    case WorkerRole::kPrefill:
      return "prefill";
    case WorkerRole::kDecode:
      return "decode";
    case WorkerRole::kBoth:
      return "both";
  }
  return "unknown";
}

absl::string_view WorkerHealthName(WorkerHealth health) {
  switch (health) {
    case WorkerHealth::kHealthy:
      return "healthy";
    case WorkerHealth::kSuspect:
      return "suspect";
    case WorkerHealth::kDown:
      return "down";
    case WorkerHealth::kDraining:
      return "draining";
  }
  return "unknown";
}

std::string WorkerRefString(const WorkerRef& ref) {
  return absl::StrCat(ref.id, "@", ref.epoch);
}

std::ostream& operator<<(std::ostream& os, const WorkerRef& ref) {
  return os << WorkerRefString(ref);
}

}  // namespace baton::coordinator
