// The gateway's in-flight operations (Generate jobs, unary calls), so that
// shutdown can cancel them all and wait until none still holds an HTTP
// exchange or a gRPC call.
#ifndef BATON_COORDINATOR_HTTP_IN_FLIGHT_H_
#define BATON_COORDINATOR_HTTP_IN_FLIGHT_H_

#include <cstdint>
#include <functional>
#include <map>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace baton::http {

class InFlight {
 public:
  InFlight() = default;
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

  // Registers an operation; `cancel` must be callable until Remove(id)
  // returns and must not block.
  uint64_t Add(std::function<void()> cancel);
  void Remove(uint64_t id);
  // Calls every registered cancel function.
  void CancelAll();
  // Until nothing is registered; false on timeout.
  bool WaitIdle(absl::Duration timeout);
  int64_t size() const;

 private:
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, std::function<void()>> cancels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::http

#endif  // BATON_COORDINATOR_HTTP_IN_FLIGHT_H_
