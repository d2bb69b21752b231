// The request state machine's attempts (retries, migrations, stale ids), the
// load it counts, lost reservation replies and the queue and transfer timers.
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/clock.h"
#include "coordinator/request_state_machine.h"
#include "coordinator/worker_rpc.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::coordinator {
namespace {

using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;
using State = RequestState;
using Loads = std::map<WorkerId, RequestLoad>;

const WorkerRef kP{"p", 1};    // prefill
const WorkerRef kP2{"p2", 2};  // prefill
const WorkerRef kD{"d", 3};    // decode
const WorkerRef kD2{"d2", 4};  // decode
const WorkerRef kB{"b", 5};    // both

// A worker RPC broke (UNAVAILABLE, tagged).
absl::Status RpcFailed(WorkerRpc rpc) {
  return TagWorkerRpc(
      absl::UnavailableError(absl::StrCat(WorkerRpcName(rpc), " stream broke")),
      rpc);
}

class RequestStateMachineAttemptsTest : public ::testing::Test {
 protected:
  RequestStateMachineAttemptsTest() { Make({}); }

  void Make(RequestStateMachineOptions options) {
    options.clock = &clock_;
    sm_ = std::make_unique<RequestStateMachine>(options);
  }

  // Drives `attempt` from QUEUED without a reservation to `target`: split
  // (reserving `blocks` on `decode`), or colocated on `prefill` without one.
  void Drive(absl::string_view attempt, State target, const WorkerRef& prefill,
             const std::optional<WorkerRef>& decode, int64_t blocks = 8) {
    ASSERT_TRUE(!decode.has_value() ||
                sm_->ReserveDecode(attempt, *decode, blocks).ok());
    if (target == State::kQueued) return;
    ASSERT_TRUE(sm_->StartPrefill(attempt, prefill, decode.has_value()).ok());
    if (target == State::kPrefilling) return;
    ASSERT_TRUE(sm_->OnFirstToken(attempt).ok());
    if (target == State::kTransferring || !decode.has_value()) return;
    ASSERT_TRUE(sm_->OnHandoff(attempt).ok());
  }

  enum class Next { kRetry, kMigrate, kFail };
  // `t` ended its attempt with `actions`: a retry, a migration or FAILED.
  static void ExpectEnded(const Transition& t, Next next,
                          const std::vector<CleanupAction>& actions) {
    EXPECT_EQ(t.to, next == Next::kFail ? State::kFailed : State::kQueued);
    EXPECT_EQ(t.new_attempt, next != Next::kFail);
    EXPECT_EQ(t.migration, next == Next::kMigrate);
    EXPECT_EQ(t.actions, actions);
  }

  // Request `id` waits, QUEUED, in a new attempt `attempt_id` (number
  // `attempt`; a migration after the first token, or a retry before it).
  void ExpectRequeued(absl::string_view id, absl::string_view attempt_id,
                      int attempt,
                      const std::vector<WorkerRef>& excluded_prefill,
                      const std::vector<WorkerRef>& excluded_decode) const {
    const RequestSnapshot snap = Snap(id);
    EXPECT_EQ(snap.state, State::kQueued);
    EXPECT_EQ(snap.attempt_id, attempt_id);
    EXPECT_EQ(snap.attempt, attempt);
    EXPECT_EQ(snap.first_token, absl::StrContains(attempt_id, "/migrate"));
    EXPECT_EQ(snap.excluded_prefill, excluded_prefill);
    EXPECT_EQ(snap.excluded_decode, excluded_decode);
    EXPECT_FALSE(snap.prefill_worker.has_value());
    EXPECT_FALSE(snap.decode_worker.has_value());
    EXPECT_FALSE(snap.colocated);
    EXPECT_TRUE(snap.status.ok());
  }
  static Transition Ok(const absl::StatusOr<Transition>& t) {
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *t : Transition{};
  }

  RequestSnapshot Snap(absl::string_view id = "r1") const {
    absl::StatusOr<RequestSnapshot> snap = sm_->Get(id);
    EXPECT_TRUE(snap.ok()) << snap.status();
    return snap.ok() ? *snap : RequestSnapshot{};
  }

  void ExpectClean() const {
    EXPECT_THAT(sm_->LiveLeases(), IsEmpty());
    EXPECT_THAT(sm_->Loads(), IsEmpty());
    EXPECT_EQ(sm_->leases_acquired(), sm_->leases_released());
    EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();
  }

  FakeClock clock_;
  std::unique_ptr<RequestStateMachine> sm_;
};

TEST_F(RequestStateMachineAttemptsTest, RetriesBeforeTheFirstToken) {
  ASSERT_TRUE(sm_->Admit("r1", RequestSpec{100, 50}).ok());
  ASSERT_NO_FATAL_FAILURE(Drive("r1", State::kPrefilling, kP, kD));
  Transition t = Ok(sm_->OnAttemptFailed("r1", RpcFailed(WorkerRpc::kPrefill)));
  EXPECT_EQ(t.request_id, "r1");
  EXPECT_EQ(t.attempt_id, "r1");
  EXPECT_EQ(t.from, State::kPrefilling);
  EXPECT_EQ(t.status, RpcFailed(WorkerRpc::kPrefill));
  // The old attempt's leases end by actions naming it.
  ExpectEnded(t, Next::kRetry, {CancelOnWorker(kP, "r1"), FreeKv(kD, "r1")});
  EXPECT_EQ(sm_->leases_released(LeaseRelease::kCleanupAction), 2);
  ExpectRequeued("r1", "r1/retry1", 2, {kP}, {});
  ExpectClean();

  // The new attempt's leases name it; its decode side fails.
  ASSERT_NO_FATAL_FAILURE(Drive("r1/retry1", State::kPrefilling, kP2, kD2));
  EXPECT_THAT(sm_->LiveLeases(),
              ElementsAre(Lease{kD2, "r1/retry1"}, Lease{kP2, "r1/retry1"}));
  t = Ok(sm_->OnAttemptFailed("r1/retry1", RpcFailed(WorkerRpc::kDecode)));
  EXPECT_EQ(t.attempt_id, "r1/retry1");
  ExpectEnded(t, Next::kRetry,
              {CancelOnWorker(kP2, "r1/retry1"), FreeKv(kD2, "r1/retry1")});
  ExpectRequeued("r1", "r1/retry2", 3, {kP}, {kD2});

  // Attempt 3 of max_attempts (3): its failure ends the request.
  ASSERT_NO_FATAL_FAILURE(Drive("r1/retry2", State::kPrefilling, kB, {}));
  t = Ok(sm_->OnAttemptFailed("r1/retry2", RpcFailed(WorkerRpc::kPrefill)));
  ExpectEnded(t, Next::kFail, {CancelOnWorker(kB, "r1/retry2")});
  EXPECT_EQ(Snap().attempt, 3);
  EXPECT_EQ(Snap().status, RpcFailed(WorkerRpc::kPrefill));
  ExpectClean();
}

TEST_F(RequestStateMachineAttemptsTest, MaxAttemptsBoundsTheRetries) {
  for (int max_attempts : {1, 2, 5}) {
    SCOPED_TRACE(max_attempts);
    Make({.max_attempts = max_attempts});
    ASSERT_TRUE(sm_->Admit("r1", RequestSpec{10, 5}).ok());
    int retries = 0;
    for (bool again = true; again && retries < 10;) {
      const std::string attempt = Snap().attempt_id;
      ASSERT_TRUE(sm_->StartPrefill(attempt, kB).ok());
      Transition t =
          Ok(sm_->OnAttemptFailed(attempt, RpcFailed(WorkerRpc::kPrefill)));
      again = t.new_attempt;
      retries += again ? 1 : 0;
      EXPECT_EQ(Snap().attempt_id,
                again ? absl::StrCat("r1/retry", retries) : attempt);
    }
    EXPECT_EQ(retries, max_attempts - 1);
    EXPECT_EQ(Snap().state, State::kFailed);
    EXPECT_EQ(Snap().attempt, max_attempts);
    ExpectClean();
  }
}

TEST_F(RequestStateMachineAttemptsTest, MigratesAfterTheFirstToken) {
  ASSERT_TRUE(sm_->Admit("r1", RequestSpec{100, 50}).ok());
  ASSERT_NO_FATAL_FAILURE(Drive("r1", State::kDecoding, kP, kD));
  Transition t = Ok(sm_->OnAttemptFailed("r1", RpcFailed(WorkerRpc::kDecode)));
  EXPECT_EQ(t.from, State::kDecoding);
  ExpectEnded(t, Next::kMigrate, {CancelOnWorker(kD, "r1")});
  ExpectRequeued("r1", "r1/migrate1", 2, {}, {kD});
  EXPECT_EQ(Snap().migrations, 1);
  ExpectClean();

  // The decode side fails again mid-transfer: migration 2.
  ASSERT_NO_FATAL_FAILURE(Drive("r1/migrate1", State::kTransferring, kP, kD2));
  t = Ok(sm_->OnAttemptFailed("r1/migrate1", RpcFailed(WorkerRpc::kDecode)));
  ExpectEnded(t, Next::kMigrate,
              {CancelOnWorker(kP, "r1/migrate1"), FreeKv(kD2, "r1/migrate1")});
  ExpectRequeued("r1", "r1/migrate2", 3, {}, {kD, kD2});

  // max_migrations (2) spent: the next failure is final.
  ASSERT_NO_FATAL_FAILURE(Drive("r1/migrate2", State::kDecoding, kP2, kB));
  t = Ok(sm_->OnAttemptFailed("r1/migrate2", RpcFailed(WorkerRpc::kDecode)));
  ExpectEnded(t, Next::kFail, {CancelOnWorker(kB, "r1/migrate2")});
  EXPECT_EQ(Snap().migrations, 2);
  EXPECT_EQ(Snap().status, RpcFailed(WorkerRpc::kDecode));
  ExpectClean();
}

// A colocated attempt migrates too, without its worker (excluded as a
// prefill worker: it would serve both sides again), up to max_migrations.
TEST_F(RequestStateMachineAttemptsTest, ColocatedMigratesWithoutItsWorker) {
  Make({.max_migrations = 1});
  ASSERT_TRUE(sm_->Admit("r1", RequestSpec{100, 50}).ok());
  ASSERT_NO_FATAL_FAILURE(Drive("r1", State::kDecoding, kB, {}));
  Transition t = Ok(sm_->OnAttemptFailed("r1", RpcFailed(WorkerRpc::kDecode)));
  ExpectEnded(t, Next::kMigrate, {CancelOnWorker(kB, "r1")});
  ExpectRequeued("r1", "r1/migrate1", 2, {kB}, {});
  ASSERT_NO_FATAL_FAILURE(Drive("r1/migrate1", State::kDecoding, kP, {}));
  t = Ok(sm_->OnAttemptFailed("r1/migrate1", RpcFailed(WorkerRpc::kDecode)));
  ExpectEnded(t, Next::kFail, {CancelOnWorker(kP, "r1/migrate1")});
  EXPECT_EQ(Snap().status, RpcFailed(WorkerRpc::kDecode));
  ExpectClean();
}

TEST_F(RequestStateMachineAttemptsTest, HandoffFailureAfterRetryMigrates) {
  ASSERT_TRUE(sm_->Admit("r1", RequestSpec{100, 50}).ok());
  ASSERT_NO_FATAL_FAILURE(Drive("r1", State::kPrefilling, kP, kD));
  ASSERT_TRUE(sm_->OnAttemptFailed("r1", RpcFailed(WorkerRpc::kPrefill)).ok());
  ASSERT_NO_FATAL_FAILURE(Drive("r1/retry1", State::kTransferring, kP2, kD));
  Transition t = Ok(
      sm_->OnAttemptFailed("r1/retry1", RpcFailed(WorkerRpc::kPrefillHandoff)));
  ExpectEnded(t, Next::kMigrate,
              {CancelOnWorker(kP2, "r1/retry1"), FreeKv(kD, "r1/retry1")});
  ExpectRequeued("r1", "r1/migrate1", 3, {kP}, {});
  // The same workers may serve the new attempt, which finishes normally.
  ASSERT_NO_FATAL_FAILURE(Drive("r1/migrate1", State::kDecoding, kP2, kD));
  t = Ok(sm_->OnFinished("r1/migrate1"));
  EXPECT_EQ(t.attempt_id, "r1/migrate1");
  EXPECT_EQ(t.to, State::kFinished);
  EXPECT_THAT(t.actions, IsEmpty());
  EXPECT_EQ(sm_->leases_released(LeaseRelease::kWorkerFreed), 2);
  ExpectClean();
}

TEST_F(RequestStateMachineAttemptsTest, WorkerDownMidTransferStartsAttempts) {
  ASSERT_TRUE(sm_->Admit("r1", RequestSpec{100, 50}).ok());
  ASSERT_TRUE(sm_->Admit("r2", RequestSpec{40, 10}).ok());
  ASSERT_TRUE(sm_->Admit("r3", RequestSpec{10, 10}).ok());
  ASSERT_NO_FATAL_FAILURE(Drive("r1", State::kTransferring, kP, kD, 8));
  ASSERT_NO_FATAL_FAILURE(Drive("r2", State::kPrefilling, kP, kD2, 4));
  ASSERT_NO_FATAL_FAILURE(Drive("r3", State::kDecoding, kP2, kD, 2));
  std::vector<Transition> ts = sm_->OnWorkerDown(kP);
  ASSERT_EQ(ts.size(), 2u);
  EXPECT_EQ(ts[0].request_id, "r1");
  ExpectEnded(ts[0], Next::kMigrate, {FreeKv(kD, "r1")});
  EXPECT_EQ(ts[1].request_id, "r2");
  ExpectEnded(ts[1], Next::kRetry, {FreeKv(kD2, "r2")});
  EXPECT_EQ(sm_->leases_released(LeaseRelease::kWorkerDown), 2);
  ExpectRequeued("r1", "r1/migrate1", 2, {kP}, {});
  ExpectRequeued("r2", "r2/retry1", 2, {kP}, {});
  EXPECT_THAT(sm_->LiveLeases(), ElementsAre(Lease{kD, "r3"}));
  EXPECT_EQ(sm_->Loads(), (Loads{{"d", {0, 2}}}));

  // The decode worker dies under r1's new transfer and under r3.
  ASSERT_NO_FATAL_FAILURE(Drive("r1/migrate1", State::kTransferring, kP2, kD));
  ts = sm_->OnWorkerDown(kD);
  ASSERT_EQ(ts.size(), 2u);
  EXPECT_EQ(ts[0].attempt_id, "r1/migrate1");
  ExpectEnded(ts[0], Next::kMigrate, {CancelOnWorker(kP2, "r1/migrate1")});
  EXPECT_EQ(ts[1].attempt_id, "r3");
  ExpectEnded(ts[1], Next::kMigrate, {});
  ExpectRequeued("r1", "r1/migrate2", 3, {kP}, {kD});
  ExpectRequeued("r3", "r3/migrate1", 2, {}, {kD});

  for (const char* id : {"r1", "r2", "r3"}) {
    ASSERT_TRUE(sm_->Cancel(id, "done").ok());
  }
  EXPECT_EQ(sm_->leases_released(LeaseRelease::kWorkerDown), 4);
  ExpectClean();
}

TEST_F(RequestStateMachineAttemptsTest, StaleAttemptIdsChangeNothing) {
  ASSERT_TRUE(sm_->Admit("r1", RequestSpec{100, 50}).ok());
  ASSERT_NO_FATAL_FAILURE(Drive("r1", State::kPrefilling, kP, kD));
  ASSERT_TRUE(sm_->OnAttemptFailed("r1", RpcFailed(WorkerRpc::kPrefill)).ok());
  ASSERT_NO_FATAL_FAILURE(Drive("r1/retry1", State::kPrefilling, kP2, kD2));
  auto events = [&](absl::string_view a) {
    return std::vector<absl::Status>{
        sm_->ReserveDecode(a, kD, 1).status(),
        sm_->OnReserveRefused(a, kD2, absl::ResourceExhaustedError("x"))
            .status(),
        sm_->StartPrefill(a, kP).status(),
        sm_->OnFirstToken(a).status(),
        sm_->OnHandoff(a).status(),
        sm_->OnFinished(a).status(),
        sm_->OnTransferTimeout(a).status(),
        sm_->OnAttemptFailed(a, RpcFailed(WorkerRpc::kPrefill)).status()};
  };
  const std::vector<Lease> leases = sm_->LiveLeases();
  const Loads loads = sm_->Loads();
  EXPECT_EQ(loads, (Loads{{"d2", {0, 8}}, {"p2", {100, 0}}}));
  for (const absl::Status& s : events("r1")) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr("attempt 'r1' is over"));
    EXPECT_THAT(s.message(), HasSubstr("'r1/retry1', PREFILLING"));
  }
  EXPECT_EQ(Snap().state, State::kPrefilling);
  EXPECT_EQ(Snap().attempt_id, "r1/retry1");
  EXPECT_EQ(sm_->LiveLeases(), leases);
  EXPECT_EQ(sm_->Loads(), loads);
  // Workers still holding the old attempt are told to drop it.
  EXPECT_THAT(sm_->Orphans(kP2, {"r1", "r1/retry1", "gone"}),
              ElementsAre("r1", "gone"));

  ASSERT_TRUE(
      sm_->OnAttemptFailed("r1/retry1", RpcFailed(WorkerRpc::kPrefill)).ok());
  for (const absl::Status& s : events("r1/retry1")) {
    EXPECT_THAT(s.code(), AnyOf(absl::StatusCode::kFailedPrecondition,
                                absl::StatusCode::kNotFound))
        << s;
  }
  for (const absl::Status& s : events("r1")) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  }
  ExpectRequeued("r1", "r1/retry2", 3, {kP, kP2}, {});
  ExpectClean();
  // Request-level events take the request id; attempt ids stay taken.
  EXPECT_EQ(sm_->Cancel("r1/retry2", "x").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(sm_->OnFirstToken("r9").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(sm_->Admit("r1/retry2", RequestSpec{}).code(),
            absl::StatusCode::kAlreadyExists);
}

TEST_F(RequestStateMachineAttemptsTest, LoadsFollowEveryEdge) {
  ASSERT_TRUE(sm_->Admit("r1", RequestSpec{100, 50}).ok());
  ASSERT_TRUE(sm_->Admit("r2", RequestSpec{30, 10}).ok());
  ASSERT_TRUE(sm_->Admit("r3", RequestSpec{7, 10}).ok());
  ASSERT_TRUE(sm_->ReserveDecode("r1", kD, 8).ok());
  EXPECT_EQ(sm_->Loads(), (Loads{{"d", {0, 8}}}));
  ASSERT_TRUE(
      sm_->OnReserveRefused("r1", kD, absl::ResourceExhaustedError("x")).ok());
  EXPECT_THAT(sm_->Loads(), IsEmpty());
  ASSERT_TRUE(sm_->ReserveDecode("r1", kD2, 8).ok());
  ASSERT_TRUE(sm_->StartPrefill("r1", kP, true).ok());
  EXPECT_EQ(sm_->Loads(), (Loads{{"d2", {0, 8}}, {"p", {100, 0}}}));
  ASSERT_NO_FATAL_FAILURE(Drive("r2", State::kPrefilling, kP, kD2, 3));
  EXPECT_EQ(sm_->Loads(), (Loads{{"d2", {0, 11}}, {"p", {130, 0}}}));
  ASSERT_TRUE(sm_->OnFirstToken("r1").ok());
  EXPECT_EQ(sm_->Loads(), (Loads{{"d2", {0, 11}}, {"p", {30, 0}}}));
  ASSERT_TRUE(sm_->OnHandoff("r1").ok());
  EXPECT_EQ(sm_->Loads(), (Loads{{"d2", {0, 11}}, {"p", {30, 0}}}));
  ASSERT_TRUE(sm_->OnFinished("r1").ok());
  EXPECT_EQ(sm_->Loads(), (Loads{{"d2", {0, 3}}, {"p", {30, 0}}}));
  // A new attempt drops the old one's load.
  ASSERT_TRUE(sm_->OnAttemptFailed("r2", RpcFailed(WorkerRpc::kPrefill)).ok());
  EXPECT_THAT(sm_->Loads(), IsEmpty());
  // Colocated: prompt tokens only, until the first token.
  ASSERT_TRUE(sm_->StartPrefill("r3", kB).ok());
  EXPECT_EQ(sm_->Loads(), (Loads{{"b", {7, 0}}}));
  ASSERT_TRUE(sm_->OnFirstToken("r3").ok());
  EXPECT_THAT(sm_->Loads(), IsEmpty());
  ASSERT_TRUE(sm_->OnFinished("r3").ok());
  // Cancel and deadline drop it too.
  ASSERT_TRUE(sm_->ReserveDecode("r2/retry1", kD, 5).ok());
  ASSERT_TRUE(sm_->Admit("r4", RequestSpec{20, 10}).ok());
  ASSERT_NO_FATAL_FAILURE(Drive("r4", State::kPrefilling, kP2, kD2, 6));
  EXPECT_EQ(sm_->Loads(),
            (Loads{{"d", {0, 5}}, {"d2", {0, 6}}, {"p2", {20, 0}}}));
  ASSERT_TRUE(sm_->Cancel("r2", "x").ok());
  EXPECT_EQ(sm_->Loads(), (Loads{{"d2", {0, 6}}, {"p2", {20, 0}}}));
  ASSERT_TRUE(sm_->OnDeadline("r4").ok());
  ExpectClean();
}

TEST_F(RequestStateMachineAttemptsTest, LostReservationReplyFreesTheBlocks) {
  Make({.max_decode_attempts = 6});
  ASSERT_TRUE(sm_->Admit("r1", RequestSpec{100, 50}).ok());
  // Refused: nothing was held. Any other code: the worker may have
  // reserved; the action frees it.
  const std::vector<std::pair<absl::Status, bool>> replies = {
      {absl::ResourceExhaustedError("full"), false},
      {absl::InvalidArgumentError("too big"), false},
      {absl::FailedPreconditionError("draining"), false},
      {absl::UnavailableError("connection reset"), true},
      {absl::DeadlineExceededError("no reply"), true},
      {absl::UnknownError("?"), true}};
  for (size_t i = 0; i < replies.size(); ++i) {
    const auto& [why, lost] = replies[i];
    SCOPED_TRACE(why.ToString());
    ASSERT_TRUE(sm_->ReserveDecode("r1", kD2, 8).ok());
    Transition t = Ok(sm_->OnReserveRefused("r1", kD2, why));
    EXPECT_EQ(t.to, i + 1 < replies.size() ? State::kQueued : State::kFailed);
    EXPECT_EQ(t.actions, lost ? std::vector{FreeKv(kD2, "r1")}
                              : std::vector<CleanupAction>{});
    ExpectClean();
  }
  EXPECT_EQ(sm_->leases_released(LeaseRelease::kRefused), 3);
  EXPECT_EQ(sm_->leases_released(LeaseRelease::kCleanupAction), 3);
  EXPECT_EQ(Snap().tried_decode_workers.size(), 6u);
  EXPECT_EQ(Snap().status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Snap().status.message(), HasSubstr("after 6 attempts"));
}

TEST_F(RequestStateMachineAttemptsTest, SplitPrefillAfterTheReservationDied) {
  ASSERT_TRUE(sm_->Admit("r1", RequestSpec{100, 50}).ok());
  ASSERT_TRUE(sm_->ReserveDecode("r1", kD, 8).ok());
  ASSERT_EQ(sm_->OnWorkerDown(kD).size(), 1u);
  const absl::Status lost = sm_->StartPrefill("r1", kP, true).status();
  EXPECT_EQ(lost.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(lost.GetPayload(kWorkerDownPayload), absl::Cord("d"));
  EXPECT_EQ(Snap().state, State::kQueued);
  ExpectClean();
  ExpectEnded(Ok(sm_->OnAttemptFailed("r1", lost)), Next::kRetry, {});
  ExpectRequeued("r1", "r1/retry1", 2, {}, {});
  EXPECT_THAT(Snap().tried_decode_workers, IsEmpty());  // a new attempt
  ASSERT_TRUE(sm_->Cancel("r1", "done").ok());
  ExpectClean();
}

TEST_F(RequestStateMachineAttemptsTest, QueueTimeoutWaitsOnlyUnreserved) {
  Make({.queue_timeout = absl::Seconds(10)});
  for (const char* id : {"a", "b", "c"}) {
    ASSERT_TRUE(sm_->Admit(id, RequestSpec{10, 10}).ok());
  }
  EXPECT_EQ(Snap("a").queue_deadline, absl::UnixEpoch() + absl::Seconds(10));
  ASSERT_TRUE(sm_->ReserveDecode("b", kD, 2).ok());
  ASSERT_NO_FATAL_FAILURE(Drive("c", State::kPrefilling, kP, kD2));
  clock_.Advance(absl::Seconds(9));
  EXPECT_THAT(sm_->ExpireDeadlines(clock_.Now()), IsEmpty());
  clock_.Advance(absl::Seconds(1));
  std::vector<Transition> ts = sm_->ExpireDeadlines(clock_.Now());
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(ts[0].request_id, "a");
  EXPECT_EQ(ts[0].status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(ts[0].status.message()),
              StartsWith(QueueTimeoutMessage(absl::Seconds(10))));
  // A held reservation suspends the timer; when it ends the timer fires.
  clock_.Advance(absl::Seconds(20));
  EXPECT_THAT(sm_->ExpireDeadlines(clock_.Now()), IsEmpty());
  ASSERT_TRUE(
      sm_->OnReserveRefused("b", kD, absl::ResourceExhaustedError("x")).ok());
  ts = sm_->ExpireDeadlines(clock_.Now());
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(ts[0].request_id, "b");
  EXPECT_EQ(ts[0].status.code(), absl::StatusCode::kResourceExhausted);
  // A new attempt restarts it.
  ASSERT_TRUE(sm_->OnAttemptFailed("c", RpcFailed(WorkerRpc::kPrefill)).ok());
  EXPECT_EQ(Snap("c").queue_deadline, clock_.Now() + absl::Seconds(10));
  clock_.Advance(absl::Seconds(9));
  EXPECT_THAT(sm_->ExpireDeadlines(clock_.Now()), IsEmpty());
  clock_.Advance(absl::Seconds(1));
  ts = sm_->ExpireDeadlines(clock_.Now());
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(ts[0].attempt_id, "c/retry1");
  EXPECT_EQ(ts[0].status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(ts[0].status.message(), HasSubstr("attempt 2"));
  ExpectClean();
}

TEST_F(RequestStateMachineAttemptsTest, TransferTimeoutAndDeadlines) {
  Make({.transfer_timeout = absl::Seconds(5)});
  const absl::Time t0 = clock_.Now();
  for (const char* id : {"a", "b", "c"}) {
    ASSERT_TRUE(sm_->Admit(id, RequestSpec{10, 10}).ok());
  }
  ASSERT_TRUE(sm_->Admit("e", RequestSpec{10, 10, t0 + absl::Seconds(3)}).ok());
  ASSERT_NO_FATAL_FAILURE(Drive("a", State::kTransferring, kP, kD));
  ASSERT_NO_FATAL_FAILURE(Drive("e", State::kPrefilling, kB, {}));
  clock_.Advance(absl::Seconds(2));
  ASSERT_NO_FATAL_FAILURE(Drive("b", State::kTransferring, kP2, kD2));
  clock_.Advance(absl::Seconds(2));
  std::vector<Transition> ts = sm_->ExpireDeadlines(clock_.Now());
  ASSERT_EQ(ts.size(), 1u);  // e's deadline
  EXPECT_EQ(ts[0].request_id, "e");
  EXPECT_EQ(ts[0].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(ts[0].actions, ElementsAre(CancelOnWorker(kB, "e")));
  clock_.Advance(absl::Seconds(1));
  ts = sm_->ExpireDeadlines(clock_.Now());
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(ts[0].request_id, "a");
  EXPECT_EQ(ts[0].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(ts[0].status.message(),
              HasSubstr("KV transfer from p@1 to d@3 timed out after 5s"));
  EXPECT_THAT(ts[0].actions,
              ElementsAre(CancelOnWorker(kP, "a"), FreeKv(kD, "a")));
  // A handoff stops the timer.
  ASSERT_TRUE(sm_->OnHandoff("b").ok());
  clock_.Advance(absl::Seconds(10));
  EXPECT_THAT(sm_->ExpireDeadlines(clock_.Now()), IsEmpty());
  ASSERT_TRUE(sm_->OnFinished("b").ok());
  // A new attempt's timer starts at its own first token.
  ASSERT_NO_FATAL_FAILURE(Drive("c", State::kTransferring, kP, kD));
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(
      sm_->OnAttemptFailed("c", RpcFailed(WorkerRpc::kPrefillHandoff)).ok());
  ASSERT_NO_FATAL_FAILURE(Drive("c/migrate1", State::kTransferring, kP, kD));
  clock_.Advance(absl::Seconds(4));
  EXPECT_THAT(sm_->ExpireDeadlines(clock_.Now()), IsEmpty());
  clock_.Advance(absl::Seconds(1));
  ts = sm_->ExpireDeadlines(clock_.Now());
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(ts[0].attempt_id, "c/migrate1");
  EXPECT_THAT(ts[0].status.message(), HasSubstr("timed out"));
  ExpectClean();
}

}  // namespace
}  // namespace baton::coordinator
