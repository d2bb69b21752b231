#include "common/mutex_checks.h"

#include "absl/flags/flag.h"
#include "absl/synchronization/mutex.h"

ABSL_FLAG(bool, mutex_deadlock_detection, false,
          "check the order of every mutex acquisition against a global lock "
          "graph and abort on a cycle (Abseil's deadlock detection: costly "
          "under load; the tests turn it on)");

namespace baton {

void ApplyMutexChecksFlag() {
  absl::SetMutexDeadlockDetectionMode(
      absl::GetFlag(FLAGS_mutex_deadlock_detection)
          ? absl::OnDeadlockCycle::kAbort
          : absl::OnDeadlockCycle::kIgnore);
}

}  // namespace baton
