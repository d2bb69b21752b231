// The request state machine's attempts: retries, migrations, corrupted KV
// bytes and stale attempt ids.
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

// KV bytes that arrived corrupted (DATA_LOSS from the handoff or the decode
// side) start a new attempt excluding no worker; DATA_LOSS from anywhere
// else (an untagged status, a ReserveKv) ends the request.
TEST_F(RequestStateMachineAttemptsTest, CorruptedKvBytesAreSentAgain) {
  auto corrupted = [](WorkerRpc rpc) {
    return TagWorkerRpc(absl::DataLossError("checksum of layer 2 mismatch"),
                        rpc);
  };
  ASSERT_TRUE(sm_->Admit("r1", RequestSpec{100, 50}).ok());
  ASSERT_NO_FATAL_FAILURE(Drive("r1", State::kPrefilling, kP, kD));
  Transition t =
      Ok(sm_->OnAttemptFailed("r1", corrupted(WorkerRpc::kPrefillHandoff)));
  ExpectEnded(t, Next::kRetry, {CancelOnWorker(kP, "r1"), FreeKv(kD, "r1")});
  ExpectRequeued("r1", "r1/retry1", 2, {}, {});
  ASSERT_NO_FATAL_FAILURE(Drive("r1/retry1", State::kTransferring, kP, kD));
  t = Ok(sm_->OnAttemptFailed("r1/retry1", corrupted(WorkerRpc::kDecode)));
  ExpectEnded(t, Next::kMigrate,
              {CancelOnWorker(kP, "r1/retry1"), FreeKv(kD, "r1/retry1")});
  ExpectRequeued("r1", "r1/migrate1", 3, {}, {});
  ExpectClean();

  for (const absl::Status& final_error :
       {absl::DataLossError("untagged"), corrupted(WorkerRpc::kReserveKv),
        corrupted(WorkerRpc::kPrefill)}) {
    SCOPED_TRACE(final_error.ToString());
    Make({});
    ASSERT_TRUE(sm_->Admit("r2", RequestSpec{100, 50}).ok());
    ASSERT_NO_FATAL_FAILURE(Drive("r2", State::kPrefilling, kP, kD));
    t = Ok(sm_->OnAttemptFailed("r2", final_error));
    ExpectEnded(t, Next::kFail, {CancelOnWorker(kP, "r2"), FreeKv(kD, "r2")});
    EXPECT_EQ(Snap("r2").status, final_error);
    ExpectClean();
  }
}

// A reservation made beside the Prefill (overlap_reserve_kv) that the
// decode worker refused, or whose reply was lost, starts a new attempt that
// excludes no worker (it reserves first); any other error of it ends the
// request, as a plain ReserveKv tag does in every state
// (NonRetriableAttemptFailureFromEveryLiveState).
TEST_F(RequestStateMachineAttemptsTest, AReservationBesideThePrefillRetries) {
  for (const absl::Status& refused :
       {absl::ResourceExhaustedError("no room"),
        absl::UnavailableError("reply lost"),
        absl::DeadlineExceededError("no reply")}) {
    SCOPED_TRACE(refused.ToString());
    Make({});
    ASSERT_TRUE(sm_->Admit("r1", RequestSpec{100, 50}).ok());
    ASSERT_NO_FATAL_FAILURE(Drive("r1", State::kPrefilling, kP, kD));
    Transition t = Ok(sm_->OnAttemptFailed(
        "r1", TagWorkerRpc(refused, WorkerRpc::kReserveKvBesidePrefill)));
    ExpectEnded(t, Next::kRetry, {CancelOnWorker(kP, "r1"), FreeKv(kD, "r1")});
    ExpectRequeued("r1", "r1/retry1", 2, {}, {});
    ExpectClean();
  }
  Make({});
  ASSERT_TRUE(sm_->Admit("r2", RequestSpec{100, 50}).ok());
  ASSERT_NO_FATAL_FAILURE(Drive("r2", State::kPrefilling, kP, kD));
  const absl::Status bad =
      TagWorkerRpc(absl::InvalidArgumentError("kv_layout differs"),
                   WorkerRpc::kReserveKvBesidePrefill);
  Transition t = Ok(sm_->OnAttemptFailed("r2", bad));
  ExpectEnded(t, Next::kFail, {CancelOnWorker(kP, "r2"), FreeKv(kD, "r2")});
  ExpectClean();
}

// The target of that reservation, sent to the prefill worker after its
// Prefill, failed as a dead worker's call does (UNAVAILABLE): the next
// attempt excludes that prefill worker, as a failed Prefill's would; any
// other error of it ends the request.
TEST_F(RequestStateMachineAttemptsTest, ALostSetKvTargetExcludesThePrefill) {
  ASSERT_TRUE(sm_->Admit("r1", RequestSpec{100, 50}).ok());
  ASSERT_NO_FATAL_FAILURE(Drive("r1", State::kPrefilling, kP, kD));
  Transition t = Ok(sm_->OnAttemptFailed(
      "r1", TagWorkerRpc(absl::UnavailableError("connection refused"),
                         WorkerRpc::kSetKvTarget)));
  ExpectEnded(t, Next::kRetry, {CancelOnWorker(kP, "r1"), FreeKv(kD, "r1")});
  ExpectRequeued("r1", "r1/retry1", 2, {kP}, {});
  ASSERT_TRUE(sm_->Admit("r2", RequestSpec{100, 50}).ok());
  ASSERT_NO_FATAL_FAILURE(Drive("r2", State::kPrefilling, kP2, kD));
  t = Ok(sm_->OnAttemptFailed(
      "r2", TagWorkerRpc(absl::FailedPreconditionError("already has one"),
                         WorkerRpc::kSetKvTarget)));
  ExpectEnded(t, Next::kFail, {CancelOnWorker(kP2, "r2"), FreeKv(kD, "r2")});
  // A target the prefill worker did not take within the worker RPC
  // timeout (a stalled worker): retried elsewhere too.
  ASSERT_TRUE(sm_->Admit("r3", RequestSpec{100, 50}).ok());
  ASSERT_NO_FATAL_FAILURE(Drive("r3", State::kPrefilling, kP2, kD));
  t = Ok(sm_->OnAttemptFailed(
      "r3", TagWorkerRpc(absl::DeadlineExceededError("Deadline Exceeded"),
                         WorkerRpc::kSetKvTarget)));
  ExpectEnded(t, Next::kRetry, {CancelOnWorker(kP2, "r3"), FreeKv(kD, "r3")});
  ExpectRequeued("r3", "r3/retry1", 2, {kP2}, {});
  ASSERT_TRUE(sm_->Cancel("r1", "done").ok());
  ASSERT_TRUE(sm_->Cancel("r3", "done").ok());
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
  EXPECT_EQ(sm_->Loads(), (Loads{{"d", {0, 2, 1}}}));

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
  EXPECT_EQ(loads, (Loads{{"d2", {0, 8, 1}}, {"p2", {100, 0}}}));
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

}  // namespace
}  // namespace baton::coordinator::testing
