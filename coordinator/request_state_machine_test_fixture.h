// The fixture of the request state machine's attempt and timer tests: a
// machine on a fake clock, worker refs, and helpers that drive an attempt
// and check how it ended.
#ifndef BATON_COORDINATOR_REQUEST_STATE_MACHINE_TEST_FIXTURE_H_
#define BATON_COORDINATOR_REQUEST_STATE_MACHINE_TEST_FIXTURE_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/clock.h"
#include "coordinator/request_state_machine.h"
#include "coordinator/worker_rpc.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::coordinator::testing {

using State = RequestState;
using Loads = std::map<WorkerId, RequestLoad>;

inline const WorkerRef kP{"p", 1};    // prefill
inline const WorkerRef kP2{"p2", 2};  // prefill
inline const WorkerRef kD{"d", 3};    // decode
inline const WorkerRef kD2{"d2", 4};  // decode
inline const WorkerRef kB{"b", 5};    // both

// A worker RPC broke (UNAVAILABLE, tagged).
inline absl::Status RpcFailed(WorkerRpc rpc) {
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
    // The worker answered: no grant is left in flight.
    ASSERT_TRUE(!decode.has_value() || sm_->OnReserved(attempt).ok());
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
    EXPECT_THAT(sm_->LiveLeases(), ::testing::IsEmpty());
    EXPECT_THAT(sm_->Loads(), ::testing::IsEmpty());
    EXPECT_EQ(sm_->leases_acquired(), sm_->leases_released());
    EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();
  }

  FakeClock clock_;
  std::unique_ptr<RequestStateMachine> sm_;
};

}  // namespace baton::coordinator::testing

#endif  // BATON_COORDINATOR_REQUEST_STATE_MACHINE_TEST_FIXTURE_H_
