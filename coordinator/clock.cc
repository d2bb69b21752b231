#include "coordinator/clock.h"

namespace baton::coordinator {
namespace {

class SystemClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

}  // namespace

Clock* RealClock() {
  static SystemClock* const clock = new SystemClock();
  return clock;
}

}  // namespace baton::coordinator
