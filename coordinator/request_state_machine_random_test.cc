// A seeded random walk over the request state machine: 10k events (valid and
// invalid, worker deaths and re-registrations, deadline sweeps) on 50 request
// ids and 6 workers. A model of the workers' pools applies exactly the leases
// the protocol creates and the cleanup actions the state machine emits; after
// every event it must equal the state machine's live leases, every free must
// hit a held lease (freed exactly once), and at the end nothing is held.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/request_state_machine.h"
#include "gtest/gtest.h"

namespace baton::coordinator {
namespace {

using State = RequestState;

constexpr int kNumRequests = 50;
constexpr int kNumEvents = 10000;

struct SimWorker {
  WorkerId id;
  WorkerRole role;
  uint64_t epoch;
};

class PoolModel {
 public:
  // A worker incarnation starts holding blocks for a request.
  void Hold(const WorkerRef& w, const std::string& request) {
    ASSERT_TRUE(held_.insert({w, request}).second)
        << request << " already held on " << w;
  }
  // A worker frees a request's blocks: they must be held (exactly once).
  void Free(const WorkerRef& w, const std::string& request) {
    ASSERT_EQ(held_.erase({w, request}), 1u)
        << request << " freed on " << w << " but not held there";
  }
  void Apply(const Transition& t) {
    for (const CleanupAction& a : t.actions) {
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

TEST(RequestStateMachineRandomTest, LeaseInvariantHoldsOnEveryStep) {
  std::mt19937_64 rng(20261130);
  auto uniform = [&](int n) {
    return static_cast<int>(std::uniform_int_distribution<int>(0, n - 1)(rng));
  };
  RequestStateMachine sm(RequestStateMachineOptions{.max_decode_attempts = 3});
  PoolModel pools;
  std::vector<SimWorker> workers = {
      {"p1", WorkerRole::kPrefill, 1}, {"p2", WorkerRole::kPrefill, 2},
      {"d1", WorkerRole::kDecode, 3},  {"d2", WorkerRole::kDecode, 4},
      {"b1", WorkerRole::kBoth, 5},    {"b2", WorkerRole::kBoth, 6}};
  uint64_t next_epoch = 7;
  absl::Time now = absl::UnixEpoch();
  std::vector<std::string> ids;
  for (int i = 0; i < kNumRequests; ++i) ids.push_back(absl::StrCat("r", i));
  std::map<State, int64_t> reached;
  int64_t generation = 0;

  auto pick_worker = [&](bool decode) {
    while (true) {
      const SimWorker& w = workers[uniform(workers.size())];
      if (decode ? CanDecode(w.role) : CanPrefill(w.role)) {
        return WorkerRef{w.id, w.epoch};
      }
    }
  };

  for (int step = 0; step < kNumEvents; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const std::string& id = ids[uniform(kNumRequests)];
    absl::StatusOr<RequestSnapshot> snap = sm.Get(id);
    const int kind = uniform(100);
    if (!snap.ok() || IsTerminal(snap->state)) {
      if (snap.ok()) {
        ASSERT_TRUE(sm.Forget(id).ok());
      }
      ASSERT_TRUE(
          sm.Admit(id, RequestSpec{1 + uniform(500), uniform(200),
                                   now + absl::Seconds(1 + uniform(30))})
              .ok());
    } else if (kind < 1) {
      // A worker dies; it comes back at once as a new incarnation.
      SimWorker& w = workers[uniform(workers.size())];
      const WorkerRef dead{w.id, w.epoch};
      for (const Transition& t : sm.OnWorkerDown(dead)) {
        ASSERT_TRUE(t.to == State::kFailed || t.to == State::kQueued);
        for (const CleanupAction& a : t.actions) {
          ASSERT_NE(a.worker.id, dead.id) << "action sent to a dead worker";
        }
        pools.Apply(t);
      }
      pools.Lose(dead);
      w.epoch = next_epoch++;
      ++generation;
    } else if (kind < 5) {
      now += absl::Seconds(uniform(4));
      for (const Transition& t : sm.ExpireDeadlines(now)) {
        ASSERT_EQ(t.status.code(), absl::StatusCode::kDeadlineExceeded);
        pools.Apply(t);
      }
    } else {
      // One event on the request; invalid ones must change nothing.
      const std::vector<Lease> before = sm.LiveLeases();
      absl::StatusOr<Transition> t;
      WorkerRef w;
      // Most events follow the normal path; the rest are drawn uniformly,
      // so invalid and abort edges are exercised from every state.
      int event = uniform(11);
      if (uniform(100) < 60) {
        switch (snap->state) {
          case State::kQueued:
            event = snap->decode_worker.has_value() || uniform(4) == 0 ? 3 : 0;
            break;
          case State::kPrefilling:
            event = 5;
            break;
          case State::kTransferring:
            event = 6;
            break;
          default:
            event = 7;
            break;
        }
      }
      switch (event) {
        case 0:
        case 1:
          w = pick_worker(/*decode=*/true);
          t = sm.ReserveDecode(id, w);
          if (t.ok()) pools.Hold(w, id);
          break;
        case 2:
          w = snap->decode_worker.value_or(pick_worker(true));
          t = sm.OnReserveRefused(id, w, absl::ResourceExhaustedError("full"));
          if (t.ok()) pools.Free(w, id);  // never held: undo the Hold
          break;
        case 3:
        case 4:
          w = pick_worker(/*decode=*/false);
          t = sm.StartPrefill(id, w);
          if (t.ok()) pools.Hold(w, id);
          break;
        case 5:
          t = sm.OnFirstToken(id);
          break;
        case 6:
          t = sm.OnHandoff(id);
          if (t.ok()) pools.Free(*snap->prefill_worker, id);
          break;
        case 7:
          t = sm.OnFinished(id);
          if (t.ok()) pools.Free(*snap->decode_worker, id);
          break;
        case 8:
          t = sm.Cancel(id, "client");
          break;
        case 9:
          t = uniform(2) == 0 ? sm.OnTransferTimeout(id) : sm.OnDeadline(id);
          break;
        case 10:
          t = sm.OnPhaseFailed(id, absl::UnavailableError("stream broke"));
          break;
      }
      if (t.ok()) {
        pools.Apply(*t);
        ASSERT_EQ(t->from, snap->state);
      } else {
        ASSERT_TRUE(t.status().code() ==
                        absl::StatusCode::kFailedPrecondition ||
                    t.status().code() == absl::StatusCode::kInvalidArgument)
            << t.status();
        ASSERT_EQ(sm.LiveLeases(), before);
        ASSERT_EQ(sm.Get(id)->state, snap->state);
      }
    }
    if (sm.Get(id).ok()) ++reached[sm.Get(id)->state];
    // The invariant, on every step.
    ASSERT_TRUE(sm.CheckInvariants().ok()) << sm.CheckInvariants();
    ASSERT_EQ(sm.LiveLeases(), pools.AsLeases());
    for (const Lease& l : sm.LiveLeases()) {
      const SimWorker* owner = nullptr;
      for (const SimWorker& s : workers) {
        if (s.id == l.worker.id) owner = &s;
      }
      ASSERT_NE(owner, nullptr);
      ASSERT_EQ(owner->epoch, l.worker.epoch)
          << "lease survived its worker's death";
    }
  }

  // Every state was visited, so the walk covered every edge family.
  for (State s : {State::kQueued, State::kPrefilling, State::kTransferring,
                  State::kDecoding, State::kFinished, State::kCancelled,
                  State::kFailed}) {
    EXPECT_GT(reached[s], 20) << RequestStateName(s);
  }
  EXPECT_GT(generation, 50);
  EXPECT_GT(pools.actions(), 500);

  // Cancel everything still live: nothing may remain on any worker.
  for (const std::string& id : ids) {
    absl::StatusOr<RequestSnapshot> snap = sm.Get(id);
    if (snap.ok() && !IsTerminal(snap->state)) {
      absl::StatusOr<Transition> t = sm.Cancel(id, "shutdown");
      ASSERT_TRUE(t.ok()) << t.status();
      pools.Apply(*t);
    }
  }
  EXPECT_TRUE(sm.LiveLeases().empty());
  EXPECT_TRUE(pools.AsLeases().empty());
  EXPECT_EQ(sm.leases_acquired(), sm.leases_released());
  EXPECT_TRUE(sm.CheckInvariants().ok());
  std::printf(
      "leases acquired %lld: action %lld, worker-freed %lld, refused "
      "%lld, worker-down %lld\n",
      static_cast<long long>(sm.leases_acquired()),
      static_cast<long long>(sm.leases_released(LeaseRelease::kCleanupAction)),
      static_cast<long long>(sm.leases_released(LeaseRelease::kWorkerFreed)),
      static_cast<long long>(sm.leases_released(LeaseRelease::kRefused)),
      static_cast<long long>(sm.leases_released(LeaseRelease::kWorkerDown)));
}

}  // namespace
}  // namespace baton::coordinator
