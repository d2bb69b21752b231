// The model behind RequestStateMachineRandomTest: the workers of the walk,
// their pools as the protocol fills them, and which workers an attempt holds
// or blames.
#ifndef BATON_COORDINATOR_REQUEST_STATE_MACHINE_RANDOM_MODEL_H_
#define BATON_COORDINATOR_REQUEST_STATE_MACHINE_RANDOM_MODEL_H_

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "coordinator/request_state_machine.h"
#include "coordinator/worker_rpc.h"
#include "gtest/gtest.h"

namespace baton::coordinator::random_walk {

using State = RequestState;
using Refs = std::vector<WorkerRef>;

struct SimWorker {
  WorkerId id;
  WorkerRole role;
  uint64_t epoch;
};

class PoolModel {
 public:
  // A worker incarnation starts holding blocks for an attempt.
  void Hold(const WorkerRef& w, const std::string& attempt) {
    ASSERT_TRUE(held_.insert({w, attempt}).second)
        << attempt << " already held on " << w;
  }
  // A worker frees an attempt's blocks: they must be held (exactly once).
  void Free(const WorkerRef& w, const std::string& attempt) {
    ASSERT_EQ(held_.erase({w, attempt}), 1u)
        << attempt << " freed on " << w << " but not held there";
  }
  void Apply(const Transition& t) {
    for (const CleanupAction& a : t.actions) {
      ASSERT_EQ(a.request_id, t.attempt_id);
      Free(a.worker, a.request_id);
      ++actions_;
    }
  }
  // A dead incarnation's pool is gone.
  void Lose(const WorkerRef& w) {
    for (auto it = held_.begin(); it != held_.end();) {
      it = it->first == w ? held_.erase(it) : std::next(it);
    }
  }
  std::vector<Lease> AsLeases() const {
    std::vector<Lease> out;
    for (const auto& [w, r] : held_) out.push_back(Lease{w, r});
    std::sort(out.begin(), out.end(), [](const Lease& a, const Lease& b) {
      return std::tie(a.worker.id, a.request_id) <
             std::tie(b.worker.id, b.request_id);
    });
    return out;
  }
  int64_t actions() const { return actions_; }

 private:
  std::set<std::pair<WorkerRef, std::string>> held_;
  int64_t actions_ = 0;
};

// The workers an attempt in `s` holds leases on (the header's table).
inline Refs Holders(const RequestSnapshot& s) {
  const bool split = !s.colocated && s.decode_worker.has_value();
  switch (s.state) {
    case State::kQueued:
      return split ? Refs{*s.decode_worker} : Refs{};
    case State::kPrefilling:
    case State::kTransferring:
      return split ? Refs{*s.prefill_worker, *s.decode_worker}
                   : Refs{*s.prefill_worker};
    case State::kDecoding:
      return Refs{*s.decode_worker};
    default:
      return {};
  }
}

// The exclusions of the attempt after `before`'s failed with `error`, which
// blames the worker named by its typed payload.
inline std::pair<Refs, Refs> Excluded(const RequestSnapshot& before,
                                      const absl::Status& error) {
  Refs prefill = before.excluded_prefill;
  Refs decode = before.excluded_decode;
  const bool split = !before.colocated && before.decode_worker.has_value();
  if (const auto who = error.GetPayload(kWorkerDownPayload)) {
    for (const WorkerRef& w : Holders(before)) {
      if (*who != w.id) continue;
      (split && w == *before.decode_worker ? decode : prefill).push_back(w);
    }
  } else if (FromWorkerRpc(error, WorkerRpc::kPrefill)) {
    prefill.push_back(*before.prefill_worker);
  } else if (FromWorkerRpc(error, WorkerRpc::kDecode)) {
    (split ? decode : prefill).push_back(*before.decode_worker);
  }
  return {prefill, decode};
}

}  // namespace baton::coordinator::random_walk

#endif  // BATON_COORDINATOR_REQUEST_STATE_MACHINE_RANDOM_MODEL_H_
