#include "coordinator/request_state_machine.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
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

  void Reset(const RequestStateMachineOptions& options = {}) {
    sm_ = std::make_unique<RequestStateMachine>(options);
  }

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

// Errors that do not say a worker failed end the attempt and the request,
// in every live state (QUEUED included), whatever the budget: UNAVAILABLE
// without a typed payload (the message text is not read), a ReserveKv tag,
// a worker-RPC tag on another code.
TEST_F(RequestStateMachineTest, NonRetriableAttemptFailureFromEveryLiveState) {
  const std::vector<std::pair<absl::Status, State>> errors = {
      {absl::DataLossError("checksum mismatch"), State::kFailed},
      {absl::UnavailableError("worker p went down"), State::kFailed},
      {TagWorkerRpc(absl::UnavailableError("x"), WorkerRpc::kReserveKv),
       State::kFailed},
      {TagWorkerRpc(absl::InternalError("bug"), WorkerRpc::kPrefill),
       State::kFailed},
      {absl::CancelledError("router gave up"), State::kCancelled},
  };
  for (const auto& [error, to] : errors) {
    for (const AbortCase& c : AbortCases()) {
      SCOPED_TRACE(
          absl::StrCat(RequestStateName(c.state), " ", error.ToString()));
      Reset();
      DriveTo(c.state, c.mode);
      auto t = sm_->OnAttemptFailed(kId, error);
      ASSERT_TRUE(t.ok()) << t.status();
      EXPECT_EQ(t->from, c.state);
      EXPECT_EQ(t->to, to);
      EXPECT_FALSE(t->new_attempt);
      EXPECT_EQ(t->attempt_id, kId);
      EXPECT_EQ(t->actions, c.actions);
      EXPECT_EQ(t->status, error);
      EXPECT_EQ(sm_->Get(kId)->status, error);
      ExpectNoLeases();
      EXPECT_THAT(sm_->Loads(), IsEmpty());
    }
  }
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

// Worker DOWN in every state, for each worker the request involves: with
// the default budget the attempt is retried (before the first token) or
// migrated (after it); without a budget the request FAILS.
struct DownCase {
  State state;
  Mode mode;
  WorkerRef down;
  // With the default options; empty: QUEUED in the same attempt.
  std::string next_attempt;
  std::vector<WorkerRef> excluded_prefill;
  std::vector<WorkerRef> excluded_decode;
  std::vector<CleanupAction> actions;
};

TEST_F(RequestStateMachineTest, WorkerDownInEveryState) {
  const std::string kRetry = "r1/retry1";
  const std::string kMigrate = "r1/migrate1";
  using A = std::vector<CleanupAction>;
  using W = std::vector<WorkerRef>;
  // clang-format off
  const std::vector<DownCase> cases = {
      // A lost reservation sends the request back for another decode worker.
      {State::kQueued, Mode::kSplit, kD, "", {}, {}, {}},
      {State::kPrefilling, Mode::kSplit, kP, kRetry, W{kP}, {},
       A{FreeKv(kD, kId)}},
      {State::kPrefilling, Mode::kSplit, kD, kRetry, {}, W{kD},
       A{CancelOnWorker(kP, kId)}},
      {State::kTransferring, Mode::kSplit, kP, kMigrate, W{kP}, {},
       A{FreeKv(kD, kId)}},
      {State::kTransferring, Mode::kSplit, kD, kMigrate, {}, W{kD},
       A{CancelOnWorker(kP, kId)}},
      {State::kDecoding, Mode::kSplit, kD, kMigrate, {}, W{kD}, {}},
      {State::kPrefilling, Mode::kColocated, kB, kRetry, W{kB}, {}, {}},
      {State::kDecoding, Mode::kColocated, kB, kMigrate, W{kB}, {}, {}},
  };
  // clang-format on
  for (bool budget : {true, false}) {
    for (const DownCase& c : cases) {
      SCOPED_TRACE(absl::StrCat(RequestStateName(c.state), " down ",
                                WorkerRefString(c.down), " budget ", budget));
      Reset(budget ? RequestStateMachineOptions{}
                   : RequestStateMachineOptions{.max_attempts = 1,
                                                .max_migrations = 0});
      DriveTo(c.state, c.mode);
      std::vector<Transition> ts = sm_->OnWorkerDown(c.down);
      ASSERT_EQ(ts.size(), 1u);
      const bool queued = c.state == State::kQueued;
      const bool again = budget && !c.next_attempt.empty();
      EXPECT_EQ(ts[0].from, c.state);
      EXPECT_EQ(ts[0].to, queued || again ? State::kQueued : State::kFailed);
      EXPECT_EQ(ts[0].attempt_id, kId);
      EXPECT_EQ(ts[0].new_attempt, again);
      EXPECT_EQ(ts[0].migration, again && c.next_attempt == kMigrate);
      EXPECT_EQ(ts[0].actions, c.actions);
      auto snap = sm_->Get(kId);
      ASSERT_TRUE(snap.ok());
      EXPECT_EQ(snap->attempt_id, again ? c.next_attempt : kId);
      EXPECT_EQ(snap->attempt, again ? 2 : 1);
      EXPECT_EQ(snap->excluded_prefill, again ? c.excluded_prefill : W{});
      EXPECT_EQ(snap->excluded_decode, again ? c.excluded_decode : W{});
      if (queued) {
        EXPECT_THAT(snap->tried_decode_workers, ElementsAre("d"));
      } else {
        EXPECT_EQ(ts[0].status.code(), absl::StatusCode::kUnavailable);
        EXPECT_THAT(ts[0].status.message(),
                    HasSubstr(absl::StrCat("worker ", WorkerRefString(c.down),
                                           " went down")));
        EXPECT_EQ(ts[0].status.GetPayload(kWorkerDownPayload),
                  absl::Cord(c.down.id));
        EXPECT_EQ(snap->status, again ? absl::OkStatus() : ts[0].status);
      }
      EXPECT_EQ(sm_->leases_released(LeaseRelease::kWorkerDown), 1);
      ExpectNoLeases();
      EXPECT_THAT(sm_->Loads(), IsEmpty());
      // Reported once: a second DOWN of the same worker changes nothing.
      EXPECT_THAT(sm_->OnWorkerDown(c.down), IsEmpty());
    }
  }
}

TEST_F(RequestStateMachineTest, WorkerDownLeavesUninvolvedRequestsAlone) {
  DriveTo(State::kDecoding, Mode::kSplit);
  // The prefill worker's lease ended at the handoff.
  EXPECT_THAT(sm_->OnWorkerDown(kP), IsEmpty());
  EXPECT_THAT(sm_->OnWorkerDown(kD2), IsEmpty());
  // Only this incarnation of the decode worker owns the lease.
  EXPECT_THAT(sm_->OnWorkerDown(WorkerRef{"d", 1}), IsEmpty());
  EXPECT_THAT(sm_->Orphans(kD, {kId, "gone"}), ElementsAre("gone"));
  EXPECT_THAT(sm_->Orphans(WorkerRef{"d", 9}, {kId}), ElementsAre(kId));
  EXPECT_EQ(StateOf(kId), State::kDecoding);
  // A newer epoch's DOWN covers the older incarnation.
  std::vector<Transition> ts = sm_->OnWorkerDown(WorkerRef{"d", 9});
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_TRUE(ts[0].migration);
  EXPECT_THAT(sm_->Get(kId)->excluded_decode, ElementsAre(kD));
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
    ASSERT_TRUE((terminal == 0   ? sm_->OnFinished(kId)
                 : terminal == 1 ? sm_->Cancel(kId, "c")
                                 : sm_->OnDeadline(kId))
                    .ok());
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
        sm_->OnAttemptFailed(kId, absl::InternalError("x")).status(),
        sm_->OnAttemptFailed(kId, TagWorkerRpc(absl::UnavailableError("x"),
                                               WorkerRpc::kDecode))
            .status(),
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
