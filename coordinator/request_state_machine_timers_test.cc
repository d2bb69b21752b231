// The request state machine's load bookkeeping, lost reservation replies
// and the queue and transfer timers.
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "coordinator/request_state_machine_test_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::coordinator::testing {
namespace {

using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

TEST_F(RequestStateMachineAttemptsTest, LoadsFollowEveryEdge) {
  ASSERT_TRUE(sm_->Admit("r1", RequestSpec{100, 50}).ok());
  ASSERT_TRUE(sm_->Admit("r2", RequestSpec{30, 10}).ok());
  ASSERT_TRUE(sm_->Admit("r3", RequestSpec{7, 10}).ok());
  // A reservation: its blocks and one sequence on the decode worker, and a
  // grant in flight until the worker answers.
  ASSERT_TRUE(sm_->ReserveDecode("r1", kD, 8).ok());
  EXPECT_EQ(sm_->Loads(), (Loads{{"d", {0, 8, 1, 1}}}));
  ASSERT_TRUE(
      sm_->OnReserveRefused("r1", kD, absl::ResourceExhaustedError("x")).ok());
  EXPECT_THAT(sm_->Loads(), IsEmpty());
  ASSERT_TRUE(sm_->ReserveDecode("r1", kD2, 8).ok());
  ASSERT_TRUE(sm_->StartPrefill("r1", kP, true).ok());
  EXPECT_EQ(sm_->Loads(), (Loads{{"d2", {0, 8, 1, 1}}, {"p", {100, 0}}}));
  ASSERT_NO_FATAL_FAILURE(Drive("r2", State::kPrefilling, kP, kD2, 3));
  EXPECT_EQ(sm_->Loads(), (Loads{{"d2", {0, 11, 2, 1}}, {"p", {130, 0}}}));
  ASSERT_TRUE(sm_->OnFirstToken("r1").ok());
  EXPECT_EQ(sm_->Loads(), (Loads{{"d2", {0, 11, 2, 1}}, {"p", {30, 0}}}));
  // A reservation made beside the Prefill may be answered after the first
  // token.
  ASSERT_TRUE(sm_->OnReserved("r1").ok());
  EXPECT_EQ(sm_->Loads(), (Loads{{"d2", {0, 11, 2}}, {"p", {30, 0}}}));
  ASSERT_TRUE(sm_->OnHandoff("r1").ok());
  EXPECT_EQ(sm_->Loads(), (Loads{{"d2", {0, 11, 2}}, {"p", {30, 0}}}));
  ASSERT_TRUE(sm_->OnFinished("r1").ok());
  EXPECT_EQ(sm_->Loads(), (Loads{{"d2", {0, 3, 1}}, {"p", {30, 0}}}));
  // A new attempt drops the old one's load.
  ASSERT_TRUE(sm_->OnAttemptFailed("r2", RpcFailed(WorkerRpc::kPrefill)).ok());
  EXPECT_THAT(sm_->Loads(), IsEmpty());
  // Colocated: no reservation; prompt tokens until the first token, a
  // sequence until the end.
  ASSERT_TRUE(sm_->StartPrefill("r3", kB).ok());
  EXPECT_EQ(sm_->Loads(), (Loads{{"b", {7, 0, 1}}}));
  ASSERT_TRUE(sm_->OnFirstToken("r3").ok());
  EXPECT_EQ(sm_->Loads(), (Loads{{"b", {0, 0, 1}}}));
  ASSERT_TRUE(sm_->OnFinished("r3").ok());
  EXPECT_THAT(sm_->Loads(), IsEmpty());
  // Colocated on a decode worker (a local prefill): its blocks count there
  // too, until the end; a split attempt ignores the count.
  ASSERT_TRUE(sm_->Admit("r5", RequestSpec{50, 10}).ok());
  ASSERT_TRUE(sm_->StartPrefill("r5", kD, /*split=*/false, 4).ok());
  EXPECT_EQ(sm_->Loads(), (Loads{{"d", {50, 4, 1}}}));
  ASSERT_TRUE(sm_->OnFirstToken("r5").ok());
  EXPECT_EQ(sm_->Loads(), (Loads{{"d", {0, 4, 1}}}));
  ASSERT_TRUE(sm_->OnFinished("r5").ok());
  EXPECT_THAT(sm_->Loads(), IsEmpty());
  // Cancel and deadline drop it too.
  ASSERT_TRUE(sm_->ReserveDecode("r2/retry1", kD, 5).ok());
  ASSERT_TRUE(sm_->Admit("r4", RequestSpec{20, 10}).ok());
  ASSERT_NO_FATAL_FAILURE(Drive("r4", State::kPrefilling, kP2, kD2, 6));
  EXPECT_EQ(sm_->Loads(),
            (Loads{{"d", {0, 5, 1, 1}}, {"d2", {0, 6, 1}}, {"p2", {20, 0}}}));
  ASSERT_TRUE(sm_->Cancel("r2", "x").ok());
  EXPECT_EQ(sm_->Loads(), (Loads{{"d2", {0, 6, 1}}, {"p2", {20, 0}}}));
  ASSERT_TRUE(sm_->OnDeadline("r4").ok());
  ExpectClean();
}

// A grant (a reservation made within the room known) is in flight until the
// worker answers it or the reservation ends; one sent to wait never is.
TEST_F(RequestStateMachineAttemptsTest, AGrantIsInFlightUntilItIsAnswered) {
  for (const char* id : {"r1", "r2", "r3", "r4"}) {
    ASSERT_TRUE(sm_->Admit(id, RequestSpec{40, 8}).ok());
  }
  ASSERT_TRUE(sm_->ReserveDecode("r1", kD, 3).ok());
  ASSERT_TRUE(sm_->ReserveDecode("r2", kD, 4, /*waits=*/true).ok());
  ASSERT_TRUE(sm_->ReserveDecode("r3", kD2, 2).ok());
  EXPECT_EQ(sm_->Loads(), (Loads{{"d", {0, 7, 2, 1}}, {"d2", {0, 2, 1, 1}}}));
  EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();
  // Answered: once counts, again changes nothing; the waiting one had
  // nothing in flight.
  ASSERT_TRUE(sm_->OnReserved("r1").ok());
  ASSERT_TRUE(sm_->OnReserved("r1").ok());
  ASSERT_TRUE(sm_->OnReserved("r2").ok());
  EXPECT_EQ(sm_->Loads(), (Loads{{"d", {0, 7, 2}}, {"d2", {0, 2, 1, 1}}}));
  // Refused: the grant ends with the reservation.
  ASSERT_TRUE(
      sm_->OnReserveRefused("r3", kD2, absl::ResourceExhaustedError("x")).ok());
  EXPECT_EQ(sm_->Loads(), (Loads{{"d", {0, 7, 2}}}));
  // Nothing to answer: no reservation, colocated, unknown, over.
  EXPECT_EQ(sm_->OnReserved("r3").code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(sm_->StartPrefill("r4", kB).ok());
  EXPECT_EQ(sm_->OnReserved("r4").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(sm_->OnReserved("nobody").code(), absl::StatusCode::kNotFound);
  // A grant still in flight when its attempt ends goes with it.
  ASSERT_TRUE(sm_->ReserveDecode("r3", kD, 2).ok());
  ASSERT_TRUE(
      sm_->OnAttemptFailed("r3", RpcFailed(WorkerRpc::kReserveKv)).ok());
  EXPECT_EQ(sm_->OnReserved("r3").code(),
            absl::StatusCode::kFailedPrecondition);
  for (const char* id : {"r1", "r2", "r4"}) {
    ASSERT_TRUE(sm_->Cancel(id, "x").ok());
  }
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

// The sweep looks only at due timers; those of requests that ended leave
// the heap at their due time, so it does not grow with finished requests,
// and a live request's later timer is armed when its earlier one passed.
TEST_F(RequestStateMachineAttemptsTest,
       TimersOfEndedRequestsLeaveAtTheirDueTime) {
  Make({.queue_timeout = absl::Seconds(10),
        .transfer_timeout = absl::Seconds(5)});
  const absl::Time t0 = clock_.Now();
  for (int i = 0; i < 100; ++i) {
    const std::string id = absl::StrCat("r", i);
    ASSERT_TRUE(
        sm_->Admit(id, RequestSpec{10, 10, t0 + absl::Seconds(30)}).ok());
    ASSERT_NO_FATAL_FAILURE(Drive(id, State::kTransferring, kP, kD));
  }
  // Each armed its queue timer at admission (earlier than its deadline) and
  // its transfer timer at its first token.
  EXPECT_EQ(sm_->pending_timers(), 200);
  for (int i = 0; i < 100; ++i) {
    const std::string id = absl::StrCat("r", i);
    ASSERT_TRUE(sm_->OnHandoff(id).ok());
    if (i == 0) continue;  // r0 keeps decoding
    ASSERT_TRUE(sm_->OnFinished(id).ok());
    ASSERT_TRUE(sm_->Forget(id).ok());
  }
  clock_.Advance(absl::Seconds(10));
  EXPECT_THAT(sm_->ExpireDeadlines(clock_.Now()), IsEmpty());
  EXPECT_EQ(sm_->pending_timers(), 1);  // r0's deadline, armed now
  clock_.Advance(absl::Seconds(20));
  std::vector<Transition> ts = sm_->ExpireDeadlines(clock_.Now());
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(ts[0].request_id, "r0");
  EXPECT_EQ(ts[0].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(sm_->pending_timers(), 0);
  ExpectClean();
}

}  // namespace
}  // namespace baton::coordinator::testing
