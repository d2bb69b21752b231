// The audit of KV leases: which worker incarnation holds blocks for which
// request. A (worker id, request id) pair holds at most one lease; each lease
// is acquired once and released exactly once, and how it ended is counted.
// Double acquisition or releasing a lease that is not live is a broken
// invariant (BATON_CHECK).
//
// Not thread-safe: owned by RequestStateMachine under its mutex.
#ifndef BATON_COORDINATOR_LEASE_LEDGER_H_
#define BATON_COORDINATOR_LEASE_LEDGER_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "coordinator/types.h"

namespace baton::coordinator {

// How a lease ended.
enum class LeaseRelease {
  // The coordinator told the worker to free it (FreeKv / CancelOnWorker).
  kCleanupAction,
  // The worker freed it itself as part of a normal edge (prefill copy after
  // the handoff, decode blocks at the end of the Decode stream).
  kWorkerFreed,
  // The worker refused the reservation: no blocks were ever set aside.
  kRefused,
  // The worker incarnation went DOWN; its pool went with it.
  kWorkerDown,
};
inline constexpr int kNumLeaseReleaseKinds = 4;

struct Lease {
  WorkerRef worker;
  std::string request_id;

  bool operator==(const Lease&) const = default;
};

class LeaseLedger {
 public:
  // REQUIRES: no live lease for (worker.id, request_id).
  void Acquire(const WorkerRef& worker, absl::string_view request_id);
  // REQUIRES: a live lease of exactly this incarnation for the request.
  void Release(const WorkerRef& worker, absl::string_view request_id,
               LeaseRelease how);

  bool Holds(const WorkerRef& worker, absl::string_view request_id) const;
  // Live leases ordered by (worker id, request id).
  std::vector<Lease> Live() const;
  std::vector<Lease> LiveOn(absl::string_view worker_id) const;

  int64_t live() const { return static_cast<int64_t>(live_.size()); }
  int64_t acquired() const { return acquired_; }
  int64_t released() const;
  int64_t released(LeaseRelease how) const {
    return released_[static_cast<int>(how)];
  }

 private:
  // (worker id, request id) -> epoch of the holding incarnation.
  std::map<std::pair<WorkerId, std::string>, uint64_t> live_;
  int64_t acquired_ = 0;
  int64_t released_[kNumLeaseReleaseKinds] = {};
};

}  // namespace baton::coordinator

#endif  // BATON_COORDINATOR_LEASE_LEDGER_H_
