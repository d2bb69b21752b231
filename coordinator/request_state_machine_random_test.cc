// A seeded random walk over the request state machine: 10k events (valid and
// invalid, stale attempt ids, attempt failures that retry, migrate or end the
// request, worker deaths, re-registrations and drains, lost reservation
// replies, deadline, queue and transfer timers on a fake clock) on 50 request
// ids and 6 workers. A model of the workers' pools applies exactly the leases
// the protocol creates (by attempt id) and the actions the state machine
// emits; after every event it must equal the live leases, every free must
// hit a held lease, the loads must be those the requests' states imply, and
// at the end nothing is held and no load is left. The model of the pools is
// request_state_machine_random_model.h.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/clock.h"
#include "coordinator/request_state_machine.h"
#include "coordinator/request_state_machine_random_model.h"
#include "coordinator/worker_rpc.h"
#include "gtest/gtest.h"

namespace baton::coordinator {
namespace {

using random_walk::Excluded;
using random_walk::Holders;
using random_walk::PoolModel;
using random_walk::Refs;
using random_walk::SimWorker;
using State = RequestState;
using Loads = std::map<WorkerId, RequestLoad>;

constexpr int kNumRequests = 50;
constexpr int kNumEvents = 10000;
constexpr int kMaxAttempts = 3;
constexpr int kMaxMigrations = 2;
constexpr absl::Duration kQueueTimeout = absl::Seconds(12);

TEST(RequestStateMachineRandomTest, LeaseInvariantHoldsOnEveryStep) {
  std::mt19937_64 rng(20261130);
  auto uniform = [&](int n) {
    return static_cast<int>(std::uniform_int_distribution<int>(0, n - 1)(rng));
  };
  FakeClock clock;
  RequestStateMachine sm(
      RequestStateMachineOptions{.max_decode_attempts = 3,
                                 .max_attempts = kMaxAttempts,
                                 .max_migrations = kMaxMigrations,
                                 .queue_timeout = kQueueTimeout,
                                 .transfer_timeout = absl::Seconds(3),
                                 .clock = &clock});
  PoolModel pools;
  std::vector<SimWorker> workers = {
      {"p1", WorkerRole::kPrefill, 1}, {"p2", WorkerRole::kPrefill, 2},
      {"d1", WorkerRole::kDecode, 3},  {"d2", WorkerRole::kDecode, 4},
      {"b1", WorkerRole::kBoth, 5},    {"b2", WorkerRole::kBoth, 6}};
  uint64_t next_epoch = 7;
  std::vector<std::string> ids;
  for (int i = 0; i < kNumRequests; ++i) ids.push_back(absl::StrCat("r", i));
  std::map<std::string, int64_t> prompt;  // request id -> prompt tokens
  std::map<std::string, int64_t> blocks;  // attempt id -> reserved blocks
  // Attempt id -> its reservation was granted (not sent to wait) and not
  // answered yet.
  std::map<std::string, bool> in_flight;
  std::map<std::string, std::vector<std::string>> stale;  // attempts over
  std::map<State, int64_t> reached;
  std::map<std::string, int64_t> n;  // edges taken, by name
  int64_t generation = 0;

  auto pick_worker = [&](bool decode) {
    while (true) {
      const SimWorker& w = workers[uniform(workers.size())];
      if (decode ? CanDecode(w.role) : CanPrefill(w.role)) {
        return WorkerRef{w.id, w.epoch};
      }
    }
  };
  auto snapshots = [&] {
    std::map<std::string, RequestSnapshot> out;
    for (const std::string& id : ids) {
      if (auto s = sm.Get(id); s.ok()) out[id] = *s;
    }
    return out;
  };
  // The loads the live requests' states imply (the header's table).
  auto implied_loads = [&] {
    Loads out;
    for (const auto& [id, s] : snapshots()) {
      if (IsTerminal(s.state)) continue;
      if (s.state == State::kPrefilling) {
        out[s.prefill_worker->id].prefill_tokens += prompt[id];
      }
      if (s.decode_worker.has_value()) {
        out[s.decode_worker->id].decode_blocks += blocks[s.attempt_id];
      }
      // Every request that has a decode worker decodes there.
      if (s.decode_worker.has_value()) ++out[s.decode_worker->id].sequences;
      if (s.decode_worker.has_value() && !s.colocated &&
          in_flight[s.attempt_id]) {
        ++out[s.decode_worker->id].grants_in_flight;
      }
    }
    std::erase_if(out,
                  [](const auto& kv) { return kv.second == RequestLoad{}; });
    return out;
  };
  // `t` ended `before`'s attempt with `error`: a new attempt exactly when a
  // worker failed it (`retriable`) and the budget allows.
  auto check_ended = [&](const RequestSnapshot& before, const Transition& t,
                         const absl::Status& error, bool retriable) {
    const bool budget = before.first_token ? before.migrations < kMaxMigrations
                                           : before.attempt < kMaxAttempts;
    ASSERT_EQ(t.attempt_id, before.attempt_id);
    ASSERT_EQ(t.new_attempt, retriable && budget) << error;
    ASSERT_EQ(t.status, error);
    const RequestSnapshot after = *sm.Get(t.request_id);
    if (!t.new_attempt) {
      ASSERT_EQ(t.to, error.code() == absl::StatusCode::kCancelled
                          ? State::kCancelled
                          : State::kFailed);
      ASSERT_EQ(after.status, error);
      return;
    }
    ASSERT_EQ(t.to, State::kQueued);
    ASSERT_EQ(t.migration, before.first_token);
    ASSERT_EQ(after.attempt_id,
              before.first_token
                  ? absl::StrCat(t.request_id, "/migrate", after.migrations)
                  : absl::StrCat(t.request_id, "/retry", before.attempt));
    ASSERT_EQ(after.attempt, before.attempt + 1);
    ASSERT_EQ(after.migrations, before.migrations + (t.migration ? 1 : 0));
    ASSERT_EQ(std::make_pair(after.excluded_prefill, after.excluded_decode),
              Excluded(before, error));
    ASSERT_EQ(after.queue_deadline, clock.Now() + kQueueTimeout);
    stale[t.request_id].push_back(before.attempt_id);
    ++n[t.migration ? "migrations" : "retries"];
  };
  auto fail_attempt = [&](const RequestSnapshot& before,
                          const absl::Status& error, bool retriable) {
    absl::StatusOr<Transition> t = sm.OnAttemptFailed(before.attempt_id, error);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_EQ(t->from, before.state);
    ASSERT_NO_FATAL_FAILURE(check_ended(before, *t, error, retriable));
    ASSERT_NO_FATAL_FAILURE(pools.Apply(*t));
  };

  for (int step = 0; step < kNumEvents; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const std::string& id = ids[uniform(kNumRequests)];
    absl::StatusOr<RequestSnapshot> snap = sm.Get(id);
    const int kind = uniform(100);
    if (!snap.ok() || IsTerminal(snap->state)) {
      ASSERT_TRUE(!snap.ok() || sm.Forget(id).ok());
      prompt[id] = 1 + uniform(500);
      stale[id].clear();
      ASSERT_TRUE(sm.Admit(id, RequestSpec{prompt[id], uniform(200),
                                           clock.Now() +
                                               absl::Seconds(1 + uniform(30))})
                      .ok());
    } else if (kind < 1) {
      // A worker dies; it comes back at once as a new incarnation.
      SimWorker& w = workers[uniform(workers.size())];
      const WorkerRef dead{w.id, w.epoch};
      auto before = snapshots();
      for (const Transition& t : sm.OnWorkerDown(dead)) {
        const RequestSnapshot& b = before[t.request_id];
        for (const CleanupAction& a : t.actions) {
          ASSERT_NE(a.worker.id, dead.id) << "action sent to a dead worker";
        }
        if (b.state == State::kQueued) {
          ASSERT_TRUE(t.to == State::kFailed || t.to == State::kQueued);
          ASSERT_FALSE(t.new_attempt);
        } else {
          ASSERT_NO_FATAL_FAILURE(check_ended(b, t, t.status, true));
        }
        ASSERT_NO_FATAL_FAILURE(pools.Apply(t));
      }
      pools.Lose(dead);
      w.epoch = next_epoch++;
      ++generation;
    } else if (kind < 3) {
      // A decode worker drains: its Decode streams end with UNAVAILABLE.
      const WorkerRef w = pick_worker(/*decode=*/true);
      const absl::Status drained = TagWorkerRpc(
          absl::UnavailableError(absl::StrCat(w.id, " is draining")),
          WorkerRpc::kDecode);
      for (const auto& [rid, s] : snapshots()) {
        if (s.state != State::kDecoding || s.decode_worker != w) continue;
        ASSERT_NO_FATAL_FAILURE(fail_attempt(s, drained, true));
        ++n[sm.Get(rid)->state == State::kQueued ? "drain migrations"
                                                 : "drain failures"];
      }
    } else if (kind < 7) {
      clock.Advance(absl::Seconds(uniform(4)));
      auto before = snapshots();
      for (const Transition& t : sm.ExpireDeadlines(clock.Now())) {
        const RequestSnapshot& b = before[t.request_id];
        ASSERT_EQ(t.to, State::kFailed);
        if (t.status.code() == absl::StatusCode::kResourceExhausted) {
          ASSERT_TRUE(b.state == State::kQueued && !b.decode_worker);
          ASSERT_TRUE(absl::StartsWith(t.status.message(),
                                       QueueTimeoutMessage(kQueueTimeout)));
          ++n["queue timeouts"];
        } else {
          ASSERT_EQ(t.status.code(), absl::StatusCode::kDeadlineExceeded);
          if (absl::StrContains(t.status.message(), "timed out")) {
            ASSERT_EQ(b.state, State::kTransferring);
            ++n["transfer timeouts"];
          }
        }
        ASSERT_NO_FATAL_FAILURE(pools.Apply(t));
      }
    } else if (kind < 12 && !stale[id].empty()) {
      // An event for an attempt that is over changes nothing.
      const std::string& old = stale[id][uniform(stale[id].size())];
      const std::vector<Lease> leases = sm.LiveLeases();
      const Loads loads = sm.Loads();
      const WorkerRef w = pick_worker(uniform(2) == 0);
      const absl::Status lost = absl::UnavailableError("x");
      for (const absl::Status& s :
           {sm.ReserveDecode(old, w, 1).status(), sm.OnReserved(old),
            sm.OnReserveRefused(old, w, lost).status(),
            sm.StartPrefill(old, w).status(), sm.OnFirstToken(old).status(),
            sm.OnHandoff(old).status(), sm.OnFinished(old).status(),
            sm.OnTransferTimeout(old).status(),
            sm.OnAttemptFailed(old, TagWorkerRpc(lost, WorkerRpc::kDecode))
                .status()}) {
        ASSERT_TRUE(absl::IsFailedPrecondition(s) || absl::IsNotFound(s)) << s;
      }
      ASSERT_EQ(sm.Get(id)->state, snap->state);
      ASSERT_EQ(sm.Get(id)->attempt_id, snap->attempt_id);
      ASSERT_EQ(sm.LiveLeases(), leases);
      ASSERT_EQ(sm.Loads(), loads);
      ++n["stale rejected"];
    } else {
      // One event on the request; invalid ones must change nothing.
      const std::string attempt = snap->attempt_id;
      const std::vector<Lease> before = sm.LiveLeases();
      absl::StatusOr<Transition> t;
      WorkerRef w;
      // Most events follow the normal path (QUEUED with a reservation: its
      // reply fails, or the prefill starts); the rest are drawn uniformly, so
      // invalid and abort edges are exercised from every state.
      const int normal[] = {!snap->decode_worker.has_value()
                                ? (uniform(4) == 0 ? 4 : 0)
                                : std::min(4, 1 + uniform(6)),
                            6, 7, 8};
      const int event = uniform(100) < 60
                            ? normal[static_cast<int>(snap->state)]
                            : uniform(13);
      if (uniform(5) == 0) {
        // The worker answered the reservation: in any live state that holds
        // one (the reply may come after the first token).
        const absl::Status answered = sm.OnReserved(attempt);
        ASSERT_EQ(answered.ok(), snap->decode_worker.has_value() &&
                                     !snap->colocated &&
                                     !IsTerminal(snap->state))
            << answered;
        if (answered.ok()) {
          in_flight[attempt] = false;
          ++n["reservation answered"];
        }
      }
      switch (event) {
        case 0:
        case 1: {
          w = pick_worker(/*decode=*/true);
          const int64_t b = uniform(20);
          // Sent to wait for room, or granted within the room known.
          const bool waits = event == 1;
          t = sm.ReserveDecode(attempt, w, b, waits);
          if (t.ok()) {
            pools.Hold(w, attempt);
            blocks[attempt] = b;
            in_flight[attempt] = !waits;
          }
          break;
        }
        case 2:
        case 3: {
          // Refused (nothing was held), or the reply was lost (the worker may
          // hold blocks: the action frees them).
          const bool lost = event == 3;
          w = snap->decode_worker.value_or(pick_worker(true));
          const absl::Status why[] = {absl::ResourceExhaustedError("full"),
                                      absl::InvalidArgumentError("big"),
                                      absl::FailedPreconditionError("drain"),
                                      absl::UnavailableError("reset"),
                                      absl::DeadlineExceededError("late")};
          t = sm.OnReserveRefused(attempt, w,
                                  why[lost ? 3 + uniform(2) : uniform(3)]);
          if (!t.ok()) break;
          ASSERT_EQ(t->actions, lost ? std::vector{FreeKv(w, attempt)}
                                     : std::vector<CleanupAction>{});
          if (!lost) pools.Free(w, attempt);  // never held: undo the Hold
          ++n[lost ? "reply lost" : "refused"];
          break;
        }
        case 4:
        case 5: {
          w = pick_worker(/*decode=*/false);
          const bool split = snap->decode_worker.has_value() || uniform(8) == 0;
          // A colocated attempt may count KV blocks (a decode worker that
          // prefills locally); a split one ignores them.
          const int64_t b = uniform(20);
          t = sm.StartPrefill(attempt, w, split, b);
          if (t.ok()) pools.Hold(w, attempt);
          if (t.ok() && !snap->decode_worker.has_value()) blocks[attempt] = b;
          if (absl::IsUnavailable(t.status())) {
            // The reservation was lost: end the attempt with the error.
            ASSERT_FALSE(snap->decode_worker.has_value());
            ASSERT_TRUE(t.status().GetPayload(kWorkerDownPayload).has_value());
            ASSERT_EQ(sm.LiveLeases(), before);
            ASSERT_NO_FATAL_FAILURE(fail_attempt(*snap, t.status(), true));
            ++n["split without reservation"];
            t = Transition{};
          }
          break;
        }
        case 6:
          t = sm.OnFirstToken(attempt);
          break;
        case 7:
          t = sm.OnHandoff(attempt);
          if (t.ok()) pools.Free(*snap->prefill_worker, attempt);
          break;
        case 8:
          t = sm.OnFinished(attempt);
          if (t.ok()) pools.Free(*snap->decode_worker, attempt);
          break;
        case 9:
          t = sm.Cancel(id, "client");
          break;
        case 10:
          t = uniform(2) == 0 ? sm.OnTransferTimeout(attempt)
                              : sm.OnDeadline(id);
          break;
        default: {
          // The attempt fails: a worker RPC of its state breaks, a worker it
          // holds a lease on goes down, or a final error.
          const Refs holders = Holders(*snap);
          absl::Status down = absl::UnavailableError("down");
          down.SetPayload(
              kWorkerDownPayload,
              absl::Cord(holders.empty()
                             ? pick_worker(true).id
                             : holders[uniform(holders.size())].id));
          std::vector<std::pair<absl::Status, bool>> errors = {
              {down, true},
              {absl::UnavailableError("no payload"), false},
              {absl::CancelledError("router"), false},
              {absl::DataLossError("checksum"), false}};
          // The RPC each running state waits on.
          const WorkerRpc rpc[] = {WorkerRpc::kReserveKv, WorkerRpc::kPrefill,
                                   WorkerRpc::kPrefillHandoff,
                                   WorkerRpc::kDecode};
          if (snap->state != State::kQueued) {
            errors.push_back({TagWorkerRpc(absl::UnavailableError("broke"),
                                           rpc[static_cast<int>(snap->state)]),
                              true});
          }
          const auto& [error, retriable] = errors[uniform(errors.size())];
          ASSERT_NO_FATAL_FAILURE(fail_attempt(*snap, error, retriable));
          t = Transition{};
          break;
        }
      }
      if (t.ok()) {
        if (!t->request_id.empty()) {
          ASSERT_NO_FATAL_FAILURE(pools.Apply(*t));
          ASSERT_EQ(t->from, snap->state);
          ASSERT_FALSE(t->new_attempt);
        }
      } else {
        ASSERT_TRUE(absl::IsFailedPrecondition(t.status()) ||
                    absl::IsInvalidArgument(t.status()))
            << t.status();
        ASSERT_EQ(sm.LiveLeases(), before);
        ASSERT_EQ(sm.Get(id)->state, snap->state);
      }
    }
    if (sm.Get(id).ok()) ++reached[sm.Get(id)->state];
    // The invariants, on every step.
    ASSERT_TRUE(sm.CheckInvariants().ok()) << sm.CheckInvariants();
    ASSERT_EQ(sm.LiveLeases(), pools.AsLeases());
    ASSERT_EQ(sm.Loads(), implied_loads());
    for (const Lease& l : sm.LiveLeases()) {
      ASSERT_TRUE(std::any_of(workers.begin(), workers.end(), [&](auto& s) {
        return WorkerRef{s.id, s.epoch} == l.worker;
      })) << "lease survived its worker's death";
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
  EXPECT_GT(n["retries"], 100);
  EXPECT_GT(n["migrations"], 30);
  EXPECT_GT(n["drain migrations"], 10);
  EXPECT_GT(n["reply lost"], 80);
  EXPECT_GT(n["refused"], 80);
  EXPECT_GT(n["queue timeouts"], 50);
  EXPECT_GT(n["transfer timeouts"], 40);
  EXPECT_GT(n["stale rejected"], 20);
  EXPECT_GT(n["split without reservation"], 5);  // only after a drop
  EXPECT_GT(n["reservation answered"], 100);

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
  EXPECT_TRUE(sm.Loads().empty());
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
  std::string edges;
  for (const auto& [k, c] : n) absl::StrAppend(&edges, " ", k, " ", c, ";");
  std::printf("edges:%s\n", edges.c_str());
}

}  // namespace
}  // namespace baton::coordinator
