// Time source of the coordinator, injected so that lease expiry and deadlines
// are testable without sleeping.
#ifndef BATON_COORDINATOR_CLOCK_H_
#define BATON_COORDINATOR_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace baton::coordinator {

// Thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// absl::Now(). The returned clock lives for the whole process.
Clock* RealClock();

// A clock that moves only when told to. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch()) : now_(start) {}
  FakeClock(const FakeClock&) = delete;
  FakeClock& operator=(const FakeClock&) = delete;

  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  // REQUIRES: d >= 0 (time never goes back).
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::coordinator

#endif  // BATON_COORDINATOR_CLOCK_H_
