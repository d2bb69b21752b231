#include "coordinator/request_state_machine.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using State = RequestState;

const WorkerRef kP{"p", 1};    // prefill
const WorkerRef kD{"d", 2};    // decode
const WorkerRef kD2{"d2", 3};  // decode
const WorkerRef kB{"b", 4};    // both (colocated)
constexpr char kId[] = "r1";

enum class Mode { kSplit, kSplitUnreserved, kColocated };

class RequestStateMachineTest : public ::testing::Test {
 protected:
  // Admits kId and drives it to `target` along the normal path.
  void DriveTo(State target, Mode mode) {
    ASSERT_TRUE(sm_->Admit(kId, RequestSpec{100, 50}).ok());
    if (mode == Mode::kSplit) {
      ASSERT_TRUE(sm_->ReserveDecode(kId, kD).ok());
    }
    if (target == State::kQueued) return;
    ASSERT_TRUE(
        sm_->StartPrefill(kId, mode == Mode::kColocated ? kB : kP).ok());
    if (target == State::kPrefilling) return;
    ASSERT_TRUE(sm_->OnFirstToken(kId).ok());
    if (target == State::kTransferring || mode == Mode::kColocated) return;
    ASSERT_TRUE(sm_->OnHandoff(kId).ok());
  }

  State StateOf(absl::string_view id) {
    auto snap = sm_->Get(id);
    EXPECT_TRUE(snap.ok()) << snap.status();
    return snap.ok() ? snap->state : State::kFailed;
  }

  void ExpectNoLeases() {
    EXPECT_THAT(sm_->LiveLeases(), IsEmpty());
    EXPECT_EQ(sm_->leases_acquired(), sm_->leases_released());
    EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();
  }

  void Reset() { sm_ = std::make_unique<RequestStateMachine>(); }

  std::unique_ptr<RequestStateMachine> sm_ =
      std::make_unique<RequestStateMachine>();
};

TEST_F(RequestStateMachineTest, SplitHappyPathHoldsTheDocumentedLeases) {
  ASSERT_TRUE(sm_->Admit(kId, RequestSpec{100, 50}).ok());
  EXPECT_THAT(sm_->LiveLeases(), IsEmpty());
  auto t = sm_->ReserveDecode(kId, kD);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->to, State::kQueued);
  EXPECT_THAT(sm_->LiveLeases(), ElementsAre(Lease{kD, kId}));
  t = sm_->StartPrefill(kId, kP);
  EXPECT_EQ(t->from, State::kQueued);
  EXPECT_EQ(t->to, State::kPrefilling);
  EXPECT_THAT(sm_->LiveLeases(), ElementsAre(Lease{kD, kId}, Lease{kP, kId}));
  t = sm_->OnFirstToken(kId);
  EXPECT_EQ(t->to, State::kTransferring);
  EXPECT_THAT(sm_->LiveLeases(), ElementsAre(Lease{kD, kId}, Lease{kP, kId}));
  t = sm_->OnHandoff(kId);
  EXPECT_EQ(t->to, State::kDecoding);
  EXPECT_THAT(t->actions, IsEmpty());
  EXPECT_THAT(sm_->LiveLeases(), ElementsAre(Lease{kD, kId}));
  EXPECT_THAT(sm_->LiveLeasesOn("p"), IsEmpty());
  t = sm_->OnFinished(kId);
  EXPECT_EQ(t->to, State::kFinished);
  EXPECT_THAT(t->actions, IsEmpty());
  EXPECT_TRUE(t->status.ok());
  ExpectNoLeases();
  EXPECT_EQ(sm_->leases_released(LeaseRelease::kWorkerFreed), 2);
  EXPECT_EQ(sm_->leases_released(LeaseRelease::kCleanupAction), 0);
}

TEST_F(RequestStateMachineTest, ColocatedSkipsTransferAndKeepsOneLease) {
  ASSERT_TRUE(sm_->Admit(kId, RequestSpec{100, 50}).ok());
  ASSERT_TRUE(sm_->StartPrefill(kId, kB).ok());
  EXPECT_THAT(sm_->LiveLeases(), ElementsAre(Lease{kB, kId}));
  auto snap = sm_->Get(kId);
  EXPECT_TRUE(snap->colocated);
  EXPECT_EQ(snap->decode_worker, kB);
  auto t = sm_->OnFirstToken(kId);
  EXPECT_EQ(t->to, State::kDecoding);
  EXPECT_THAT(sm_->LiveLeases(), ElementsAre(Lease{kB, kId}));
  ASSERT_TRUE(sm_->OnFinished(kId).ok());
  ExpectNoLeases();
  EXPECT_EQ(sm_->leases_acquired(), 1);
}

// One abort edge from one live state: the exact cleanup it must emit.
struct AbortCase {
  State state;
  Mode mode;
  std::vector<CleanupAction> actions;
};

std::vector<AbortCase> AbortCases() {
  return {
      {State::kQueued, Mode::kSplitUnreserved, {}},
      {State::kQueued, Mode::kSplit, {FreeKv(kD, kId)}},
      {State::kPrefilling,
       Mode::kSplit,
       {CancelOnWorker(kP, kId), FreeKv(kD, kId)}},
      {State::kTransferring,
       Mode::kSplit,
       {CancelOnWorker(kP, kId), FreeKv(kD, kId)}},
      {State::kDecoding, Mode::kSplit, {CancelOnWorker(kD, kId)}},
      {State::kPrefilling, Mode::kColocated, {CancelOnWorker(kB, kId)}},
      {State::kDecoding, Mode::kColocated, {CancelOnWorker(kB, kId)}},
  };
}

TEST_F(RequestStateMachineTest, ClientCancelFromEveryLiveState) {
  for (const AbortCase& c : AbortCases()) {
    SCOPED_TRACE(RequestStateName(c.state));
    Reset();
    DriveTo(c.state, c.mode);
    ASSERT_EQ(StateOf(kId), c.state);
    auto t = sm_->Cancel(kId, "client went away");
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->from, c.state);
    EXPECT_EQ(t->to, State::kCancelled);
    EXPECT_EQ(t->actions, c.actions);
    EXPECT_EQ(t->status.code(), absl::StatusCode::kCancelled);
    EXPECT_THAT(t->status.message(), HasSubstr("client went away"));
    ExpectNoLeases();
  }
}

TEST_F(RequestStateMachineTest, DeadlineFromEveryLiveState) {
  for (const AbortCase& c : AbortCases()) {
    SCOPED_TRACE(RequestStateName(c.state));
    Reset();
    DriveTo(c.state, c.mode);
    auto t = sm_->OnDeadline(kId);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->to, State::kFailed);
    EXPECT_EQ(t->actions, c.actions);
    EXPECT_EQ(t->status.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(t->status.message(), HasSubstr(RequestStateName(c.state)));
    ExpectNoLeases();
  }
}

TEST_F(RequestStateMachineTest, PhaseFailureFromEveryRunningState) {
  for (const AbortCase& c : AbortCases()) {
    if (c.state == State::kQueued) continue;
    SCOPED_TRACE(RequestStateName(c.state));
    Reset();
    DriveTo(c.state, c.mode);
    auto t = sm_->OnPhaseFailed(kId, absl::DataLossError("checksum mismatch"));
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->to, State::kFailed);
    EXPECT_EQ(t->actions, c.actions);
    EXPECT_EQ(t->status, absl::DataLossError("checksum mismatch"));
    ExpectNoLeases();
  }
  // Not accepted while queued: no phase is running.
  Reset();
  DriveTo(State::kQueued, Mode::kSplit);
  EXPECT_EQ(sm_->OnPhaseFailed(kId, absl::InternalError("x")).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(RequestStateMachineTest, TransferTimeoutOnlyWhileTransferring) {
  DriveTo(State::kTransferring, Mode::kSplit);
  auto t = sm_->OnTransferTimeout(kId);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->to, State::kFailed);
  EXPECT_THAT(t->actions,
              ElementsAre(CancelOnWorker(kP, kId), FreeKv(kD, kId)));
  EXPECT_EQ(t->status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(t->status.message(),
              HasSubstr("KV transfer from p@1 to d@2 timed out"));
  ExpectNoLeases();

  for (State s : {State::kQueued, State::kPrefilling, State::kDecoding}) {
    Reset();
    DriveTo(s, Mode::kSplit);
    absl::Status bad = sm_->OnTransferTimeout(kId).status();
    EXPECT_EQ(bad.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(bad.message(), HasSubstr(RequestStateName(s)));
    EXPECT_THAT(bad.message(), HasSubstr("TRANSFERRING"));
  }
}

// Worker DOWN in every state, for each worker the request involves.
struct DownCase {
  State state;
  Mode mode;
  WorkerRef down;
  State to;
  std::vector<CleanupAction> actions;
};

TEST_F(RequestStateMachineTest, WorkerDownInEveryState) {
  const std::vector<DownCase> cases = {
      // A lost reservation sends the request back for another decode worker.
      {State::kQueued, Mode::kSplit, kD, State::kQueued, {}},
      {State::kPrefilling, Mode::kSplit, kP, State::kFailed, {FreeKv(kD, kId)}},
      {State::kPrefilling,
       Mode::kSplit,
       kD,
       State::kFailed,
       {CancelOnWorker(kP, kId)}},
      {State::kTransferring,
       Mode::kSplit,
       kP,
       State::kFailed,
       {FreeKv(kD, kId)}},
      {State::kTransferring,
       Mode::kSplit,
       kD,
       State::kFailed,
       {CancelOnWorker(kP, kId)}},
      {State::kDecoding, Mode::kSplit, kD, State::kFailed, {}},
      {State::kPrefilling, Mode::kColocated, kB, State::kFailed, {}},
      {State::kDecoding, Mode::kColocated, kB, State::kFailed, {}},
  };
  for (const DownCase& c : cases) {
    SCOPED_TRACE(absl::StrCat(RequestStateName(c.state), " down ",
                              WorkerRefString(c.down)));
    Reset();
    DriveTo(c.state, c.mode);
    std::vector<Transition> ts = sm_->OnWorkerDown(c.down);
    ASSERT_EQ(ts.size(), 1u);
    EXPECT_EQ(ts[0].from, c.state);
    EXPECT_EQ(ts[0].to, c.to);
    EXPECT_EQ(ts[0].actions, c.actions);
    if (c.to == State::kFailed) {
      EXPECT_EQ(ts[0].status.code(), absl::StatusCode::kUnavailable);
      EXPECT_THAT(ts[0].status.message(),
                  HasSubstr(absl::StrCat("worker ", WorkerRefString(c.down),
                                         " went down")));
    } else {
      EXPECT_THAT(sm_->Get(kId)->tried_decode_workers, ElementsAre("d"));
    }
    EXPECT_EQ(sm_->leases_released(LeaseRelease::kWorkerDown), 1);
    ExpectNoLeases();
    // Reported once: a second DOWN of the same worker changes nothing.
    EXPECT_THAT(sm_->OnWorkerDown(c.down), IsEmpty());
  }
}

TEST_F(RequestStateMachineTest, WorkerDownLeavesUninvolvedRequestsAlone) {
  DriveTo(State::kDecoding, Mode::kSplit);
  // The prefill worker's lease ended at the handoff.
  EXPECT_THAT(sm_->OnWorkerDown(kP), IsEmpty());
  EXPECT_THAT(sm_->OnWorkerDown(kD2), IsEmpty());
  // An older incarnation of the decode worker does not own this lease.
  EXPECT_THAT(sm_->OnWorkerDown(WorkerRef{"d", 1}), IsEmpty());
  EXPECT_EQ(StateOf(kId), State::kDecoding);
  // A newer epoch's DOWN covers the older incarnation.
  std::vector<Transition> ts = sm_->OnWorkerDown(WorkerRef{"d", 9});
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(ts[0].to, State::kFailed);
  ExpectNoLeases();
}

TEST_F(RequestStateMachineTest, RefusedReservationsRetryThenFail) {
  ASSERT_TRUE(sm_->Admit(kId, RequestSpec{100, 50}).ok());
  ASSERT_TRUE(sm_->ReserveDecode(kId, kD).ok());
  absl::Status twice = sm_->ReserveDecode(kId, kD2).status();
  EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(twice.message(), HasSubstr("reservation on d@2 is held"));
  EXPECT_EQ(sm_->OnReserveRefused(kId, kD2, absl::ResourceExhaustedError("x"))
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);

  auto t = sm_->OnReserveRefused(kId, kD, absl::ResourceExhaustedError("full"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->to, State::kQueued);
  EXPECT_THAT(t->actions, IsEmpty());
  EXPECT_THAT(sm_->LiveLeases(), IsEmpty());
  ASSERT_TRUE(sm_->ReserveDecode(kId, kD2).ok());
  ASSERT_TRUE(
      sm_->OnReserveRefused(kId, kD2, absl::ResourceExhaustedError("x")).ok());
  ASSERT_TRUE(sm_->ReserveDecode(kId, kB).ok());
  t = sm_->OnReserveRefused(
      kId, kB, absl::ResourceExhaustedError("need 10 blocks, 3 free"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->to, State::kFailed);
  EXPECT_THAT(t->actions, IsEmpty());
  EXPECT_EQ(t->status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(t->status.message(),
              HasSubstr("after 3 attempts (d, d2, b); last: need 10 blocks"));
  EXPECT_THAT(sm_->Get(kId)->tried_decode_workers, ElementsAre("d", "d2", "b"));
  EXPECT_EQ(sm_->leases_released(LeaseRelease::kRefused), 3);
  ExpectNoLeases();
}

TEST_F(RequestStateMachineTest, RefusedThenServedByAnotherDecodeWorker) {
  ASSERT_TRUE(sm_->Admit(kId, RequestSpec{100, 50}).ok());
  ASSERT_TRUE(sm_->ReserveDecode(kId, kD).ok());
  ASSERT_TRUE(
      sm_->OnReserveRefused(kId, kD, absl::ResourceExhaustedError("full"))
          .ok());
  ASSERT_TRUE(sm_->ReserveDecode(kId, kD2).ok());
  ASSERT_TRUE(sm_->StartPrefill(kId, kP).ok());
  ASSERT_TRUE(sm_->OnFirstToken(kId).ok());
  ASSERT_TRUE(sm_->OnHandoff(kId).ok());
  EXPECT_THAT(sm_->LiveLeases(), ElementsAre(Lease{kD2, kId}));
  ASSERT_TRUE(sm_->OnFinished(kId).ok());
  ExpectNoLeases();
}

TEST_F(RequestStateMachineTest, InvalidForwardEdgesNameBothStates) {
  struct Bad {
    State state;
    std::string event;
    std::string allowed;
  };
  const std::vector<Bad> bad = {
      {State::kQueued, "OnFirstToken", "PREFILLING"},
      {State::kQueued, "OnHandoff", "TRANSFERRING"},
      {State::kQueued, "OnFinished", "DECODING"},
      {State::kPrefilling, "StartPrefill", "QUEUED"},
      {State::kPrefilling, "ReserveDecode", "QUEUED"},
      {State::kPrefilling, "OnHandoff", "TRANSFERRING"},
      {State::kPrefilling, "OnFinished", "DECODING"},
      {State::kTransferring, "OnFirstToken", "PREFILLING"},
      {State::kTransferring, "OnFinished", "DECODING"},
      {State::kTransferring, "OnReserveRefused", "QUEUED"},
      {State::kDecoding, "OnHandoff", "TRANSFERRING"},
      {State::kDecoding, "StartPrefill", "QUEUED"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(absl::StrCat(RequestStateName(b.state), " ", b.event));
    Reset();
    DriveTo(b.state, Mode::kSplit);
    const std::vector<Lease> before = sm_->LiveLeases();
    absl::Status s;
    if (b.event == "OnFirstToken") s = sm_->OnFirstToken(kId).status();
    if (b.event == "OnHandoff") s = sm_->OnHandoff(kId).status();
    if (b.event == "OnFinished") s = sm_->OnFinished(kId).status();
    if (b.event == "StartPrefill") s = sm_->StartPrefill(kId, kP).status();
    if (b.event == "ReserveDecode") s = sm_->ReserveDecode(kId, kD2).status();
    if (b.event == "OnReserveRefused") {
      s = sm_->OnReserveRefused(kId, kD, absl::ResourceExhaustedError("x"))
              .status();
    }
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(),
                HasSubstr(absl::StrCat(b.event, " is invalid in state ",
                                       RequestStateName(b.state),
                                       " (allowed in ", b.allowed)));
    EXPECT_EQ(StateOf(kId), b.state);
    EXPECT_EQ(sm_->LiveLeases(), before);
    EXPECT_TRUE(sm_->CheckInvariants().ok());
  }
}

TEST_F(RequestStateMachineTest, TerminalStatesAcceptNoEvent) {
  for (int terminal = 0; terminal < 3; ++terminal) {
    Reset();
    DriveTo(State::kDecoding, Mode::kSplit);
    if (terminal == 0) {
      ASSERT_TRUE(sm_->OnFinished(kId).ok());
    }
    if (terminal == 1) {
      ASSERT_TRUE(sm_->Cancel(kId, "c").ok());
    }
    if (terminal == 2) {
      ASSERT_TRUE(sm_->OnDeadline(kId).ok());
    }
    const State state = StateOf(kId);
    SCOPED_TRACE(RequestStateName(state));
    const std::vector<absl::Status> results = {
        sm_->ReserveDecode(kId, kD2).status(),
        sm_->OnReserveRefused(kId, kD, absl::ResourceExhaustedError("x"))
            .status(),
        sm_->StartPrefill(kId, kP).status(),
        sm_->OnFirstToken(kId).status(),
        sm_->OnHandoff(kId).status(),
        sm_->OnFinished(kId).status(),
        sm_->Cancel(kId, "late").status(),
        sm_->OnDeadline(kId).status(),
        sm_->OnTransferTimeout(kId).status(),
        sm_->OnPhaseFailed(kId, absl::InternalError("x")).status(),
    };
    for (const absl::Status& s : results) {
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
      EXPECT_THAT(s.message(), HasSubstr(RequestStateName(state)));
    }
    EXPECT_THAT(sm_->OnWorkerDown(kD), IsEmpty());
    EXPECT_THAT(sm_->ExpireDeadlines(absl::InfiniteFuture()), IsEmpty());
    ExpectNoLeases();
    EXPECT_EQ(StateOf(kId), state);
    ASSERT_TRUE(sm_->Forget(kId).ok());
    EXPECT_EQ(sm_->Get(kId).status().code(), absl::StatusCode::kNotFound);
  }
}

TEST_F(RequestStateMachineTest, AdmitAndLookupErrors) {
  EXPECT_EQ(sm_->Admit("", RequestSpec{}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sm_->Admit("r", RequestSpec{0, 1}).message(),
              HasSubstr("prompt_tokens must be >= 1, got 0"));
  EXPECT_THAT(sm_->Admit("r", RequestSpec{1, -1}).message(),
              HasSubstr("max_tokens must be >= 0, got -1"));
  ASSERT_TRUE(sm_->Admit("r", RequestSpec{1, 1}).ok());
  EXPECT_EQ(sm_->Admit("r", RequestSpec{1, 1}).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(sm_->Cancel("nope", "x").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(sm_->Forget("r").code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(sm_->ReserveDecode("r", kD).ok());
  absl::Status same = sm_->StartPrefill("r", WorkerRef{"d", 2}).status();
  EXPECT_EQ(same.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(same.message(), HasSubstr("colocated"));
}

TEST_F(RequestStateMachineTest, ExpireDeadlinesFailsOnlyExpiredLiveRequests) {
  const absl::Time t0 = absl::UnixEpoch();
  ASSERT_TRUE(sm_->Admit("a", RequestSpec{10, 10, t0 + absl::Seconds(1)}).ok());
  ASSERT_TRUE(sm_->Admit("b", RequestSpec{10, 10, t0 + absl::Seconds(5)}).ok());
  ASSERT_TRUE(sm_->Admit("c", RequestSpec{10, 10, t0 + absl::Seconds(2)}).ok());
  ASSERT_TRUE(sm_->ReserveDecode("a", kD).ok());
  ASSERT_TRUE(sm_->StartPrefill("a", kP).ok());
  ASSERT_TRUE(sm_->StartPrefill("c", kB).ok());
  EXPECT_THAT(sm_->ExpireDeadlines(t0), IsEmpty());
  std::vector<Transition> ts = sm_->ExpireDeadlines(t0 + absl::Seconds(2));
  ASSERT_EQ(ts.size(), 2u);
  EXPECT_EQ(ts[0].request_id, "a");
  EXPECT_THAT(ts[0].actions,
              ElementsAre(CancelOnWorker(kP, "a"), FreeKv(kD, "a")));
  EXPECT_EQ(ts[1].request_id, "c");
  EXPECT_THAT(ts[1].actions, ElementsAre(CancelOnWorker(kB, "c")));
  EXPECT_EQ(StateOf("b"), State::kQueued);
  ASSERT_TRUE(sm_->Cancel("b", "done").ok());
  ExpectNoLeases();
}

TEST_F(RequestStateMachineTest, OrphansAreLeasesTheCoordinatorDoesNotTrack) {
  ASSERT_TRUE(sm_->Admit("r1", RequestSpec{10, 10}).ok());
  ASSERT_TRUE(sm_->ReserveDecode("r1", kD).ok());
  ASSERT_TRUE(sm_->Admit("r2", RequestSpec{10, 10}).ok());
  ASSERT_TRUE(sm_->StartPrefill("r2", kB).ok());
  EXPECT_THAT(sm_->Orphans(kD, {"r1", "r2", "gone"}),
              ElementsAre("r2", "gone"));
  // A new incarnation holds none of the old one's leases.
  EXPECT_THAT(sm_->Orphans(WorkerRef{"d", 7}, {"r1"}), ElementsAre("r1"));
  ASSERT_TRUE(sm_->Cancel("r1", "x").ok());
  ASSERT_TRUE(sm_->Cancel("r2", "x").ok());
  ExpectNoLeases();
}

TEST(RequestStateMachineConcurrencyTest, ThreadsDrivingRequestsLeakNothing) {
  RequestStateMachine sm;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&sm, t] {
      for (int i = 0; i < 500; ++i) {
        const std::string id = absl::StrCat("t", t, "-", i);
        if (!sm.Admit(id, RequestSpec{10, 10}).ok()) return;
        (void)sm.ReserveDecode(id, kD);
        (void)sm.StartPrefill(id, kP);
        (void)sm.OnFirstToken(id);
        if (i % 3 == 0) {
          (void)sm.Cancel(id, "client");
        } else {
          (void)sm.OnHandoff(id);
          (void)sm.OnFinished(id);
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_TRUE(sm.LiveLeases().empty());
  EXPECT_EQ(sm.leases_acquired(), 4 * 500 * 2);
  EXPECT_EQ(sm.leases_released(), sm.leases_acquired());
  EXPECT_TRUE(sm.CheckInvariants().ok());
}

}  // namespace
}  // namespace baton::coordinator
