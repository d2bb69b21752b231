#include "coordinator/routing_policy.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::coordinator {
namespace {

using ::testing::HasSubstr;

constexpr char kModel[] = "smollm2-135m";

WorkerInfo Worker(absl::string_view id, WorkerRole role, int64_t queued,
                  int64_t free_blocks, int64_t total_blocks = 100,
                  WorkerHealth health = WorkerHealth::kHealthy) {
  WorkerInfo w;
  w.ref = WorkerRef{std::string(id), 1};
  w.registration.role = role;
  w.registration.address = absl::StrCat(id, ":1");
  w.registration.model_id = kModel;
  w.registration.kv_layout.block_size = 16;
  w.registration.kv_blocks_total = total_blocks;
  w.health = health;
  w.load.queued_prefill_tokens = queued;
  w.load.kv_blocks_free = free_blocks;
  w.load.kv_blocks_total = total_blocks;
  return w;
}

RequestInfo Request(int64_t prompt, int64_t max_tokens) {
  RequestInfo info;
  info.model_id = kModel;
  info.prompt_tokens = prompt;
  info.max_tokens = max_tokens;
  return info;
}

TEST(RoutingPolicyTest, DecodeBlocksNeededRoundsUp) {
  EXPECT_EQ(DecodeBlocksNeeded(Request(1, 0), 16), 1);
  EXPECT_EQ(DecodeBlocksNeeded(Request(16, 0), 16), 1);
  EXPECT_EQ(DecodeBlocksNeeded(Request(16, 1), 16), 2);
  EXPECT_EQ(DecodeBlocksNeeded(Request(100, 60), 16), 10);
}

TEST(LeastLoadedPolicyTest, PrefillPicksLeastQueuedTokens) {
  auto policy = NewLeastLoadedPolicy();
  Candidates c = {Worker("w1", WorkerRole::kPrefill, 500, 0),
                  Worker("w2", WorkerRole::kPrefill, 20, 0),
                  Worker("w3", WorkerRole::kPrefill, 300, 0),
                  Worker("w4", WorkerRole::kDecode, 0, 100)};
  auto picked = policy->PickPrefill(c, Request(10, 10));
  ASSERT_TRUE(picked.ok()) << picked.status();
  EXPECT_EQ(picked->id, "w2");
}

TEST(LeastLoadedPolicyTest, DecodePicksMostFreeBlocks) {
  auto policy = NewLeastLoadedPolicy();
  Candidates c = {Worker("w1", WorkerRole::kDecode, 0, 30),
                  Worker("w2", WorkerRole::kDecode, 0, 80),
                  Worker("w3", WorkerRole::kPrefill, 0, 99),
                  Worker("w4", WorkerRole::kDecode, 0, 50)};
  EXPECT_EQ(policy->PickDecode(c, Request(10, 10))->id, "w2");
}

TEST(LeastLoadedPolicyTest, TiesGoToSmallestIdWhateverTheInputOrder) {
  auto policy = NewLeastLoadedPolicy();
  Candidates c = {Worker("w3", WorkerRole::kBoth, 7, 40),
                  Worker("w1", WorkerRole::kBoth, 7, 40),
                  Worker("w2", WorkerRole::kBoth, 7, 40)};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(policy->PickPrefill(c, Request(10, 10))->id, "w1");
    EXPECT_EQ(policy->PickDecode(c, Request(10, 10))->id, "w1");
    std::rotate(c.begin(), c.begin() + 1, c.end());
  }
}

TEST(LeastLoadedPolicyTest, PrefillTiesGoToTheFewestRunningSequences) {
  auto policy = NewLeastLoadedPolicy();
  // No prompt queued on either colocated worker: the idle one takes the
  // prompt instead of stalling w1's twelve decodes behind its prefill.
  Candidates c = {Worker("w1", WorkerRole::kBoth, 0, 40),
                  Worker("w2", WorkerRole::kBoth, 0, 40)};
  c[0].load.running_sequences = 12;
  c[1].load.running_sequences = 3;
  EXPECT_EQ(policy->PickPrefill(c, Request(10, 10))->id, "w2");
  // Queued prompt tokens still come first.
  c[1].load.queued_prefill_tokens = 1;
  EXPECT_EQ(policy->PickPrefill(c, Request(10, 10))->id, "w1");
}

TEST(LeastLoadedPolicyTest, BothRoleIsEligibleForEitherPhase) {
  auto policy = NewLeastLoadedPolicy();
  Candidates c = {Worker("p", WorkerRole::kPrefill, 100, 0),
                  Worker("b", WorkerRole::kBoth, 5, 10),
                  Worker("d", WorkerRole::kDecode, 0, 8)};
  EXPECT_EQ(policy->PickPrefill(c, Request(10, 10))->id, "b");
  EXPECT_EQ(policy->PickDecode(c, Request(10, 10))->id, "b");
  Candidates only_both = {Worker("b", WorkerRole::kBoth, 5, 10)};
  EXPECT_EQ(policy->PickPrefill(only_both, Request(10, 10))->id, "b");
  EXPECT_EQ(policy->PickDecode(only_both, Request(10, 10))->id, "b");
}

TEST(LeastLoadedPolicyTest, DecodeOnlyConsidersWorkersWithRoom) {
  auto policy = NewLeastLoadedPolicy();
  // 100 + 60 tokens at 16 per block: 10 blocks.
  Candidates c = {Worker("w1", WorkerRole::kDecode, 0, 9),
                  Worker("w2", WorkerRole::kDecode, 0, 10)};
  EXPECT_EQ(policy->PickDecode(c, Request(100, 60))->id, "w2");
  c[1].registration.kv_layout.block_size = 8;  // w2 now needs 20 blocks
  auto none = policy->PickDecode(c, Request(100, 60));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(none.status().message(),
              HasSubstr("need 20 KV blocks (prompt 100 + max_tokens 60 tokens, "
                        "block size 8); most free is w2 with 10 of 100"));
}

TEST(LeastLoadedPolicyTest, SkipsUnhealthyOtherModelsAndExcluded) {
  auto policy = NewLeastLoadedPolicy();
  Candidates c = {
      Worker("w1", WorkerRole::kDecode, 0, 90, 100, WorkerHealth::kSuspect),
      Worker("w2", WorkerRole::kDecode, 0, 80, 100, WorkerHealth::kDown),
      Worker("w3", WorkerRole::kDecode, 0, 70, 100, WorkerHealth::kDraining),
      Worker("w4", WorkerRole::kDecode, 0, 60),
      Worker("w5", WorkerRole::kDecode, 0, 50),
      Worker("w6", WorkerRole::kDecode, 0, 99)};
  c[5].registration.model_id = "other-model";
  RequestInfo request = Request(10, 10);
  EXPECT_EQ(policy->PickDecode(c, request)->id, "w4");
  request.excluded = {"w4"};
  EXPECT_EQ(policy->PickDecode(c, request)->id, "w5");
  request.excluded = {"w4", "w5"};
  auto none = policy->PickDecode(c, request);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(none.status().message(),
              HasSubstr("no healthy decode worker (role decode or both) for "
                        "model 'smollm2-135m' (3 not healthy, 2 already "
                        "tried)"));
}

TEST(LeastLoadedPolicyTest, NoWorkerOfARoleIsUnavailableNamingThePool) {
  auto policy = NewLeastLoadedPolicy();
  Candidates decode_only = {Worker("d", WorkerRole::kDecode, 0, 100)};
  auto p = policy->PickPrefill(decode_only, Request(10, 10));
  EXPECT_EQ(p.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(p.status().message(), HasSubstr("no healthy prefill worker"));
  Candidates prefill_only = {Worker("p", WorkerRole::kPrefill, 0, 0)};
  auto d = policy->PickDecode(prefill_only, Request(10, 10));
  EXPECT_EQ(d.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(d.status().message(), HasSubstr("no healthy decode worker"));
  EXPECT_EQ(policy->PickPrefill({}, Request(10, 10)).status().code(),
            absl::StatusCode::kUnavailable);
}

// Late heartbeats of the whole prefill pool (the coordinator or its host
// stalled) neither switch to colocated serving nor fail requests at once:
// the pool is waited for while a suspect member could serve.
TEST(RoutingPolicyTest, ASuspectPoolIsWaitedForNotAbandoned) {
  Candidates c = {
      Worker("p1", WorkerRole::kPrefill, 0, 0, 100, WorkerHealth::kSuspect),
      Worker("p2", WorkerRole::kPrefill, 0, 0, 100, WorkerHealth::kDown),
      Worker("b", WorkerRole::kBoth, 0, 100),
      Worker("d", WorkerRole::kDecode, 0, 100, 100, WorkerHealth::kSuspect)};
  EXPECT_EQ(PrefillRole(c, kModel), WorkerRole::kPrefill);
  auto is_prefill = +[](WorkerRole r) { return r == WorkerRole::kPrefill; };
  RequestInfo request = Request(10, 10);
  EXPECT_TRUE(AnySuspect(c, request, is_prefill));
  EXPECT_TRUE(AnySuspect(c, request, &CanDecode));
  request.excluded = {"p1"};
  EXPECT_FALSE(AnySuspect(c, request, is_prefill));
  request.model_id = "other-model";
  EXPECT_FALSE(AnySuspect(c, request, &CanDecode));
  // A prefill pool that is only DOWN or draining: colocated on `both`.
  c[0].health = WorkerHealth::kDraining;
  EXPECT_EQ(PrefillRole(c, kModel), WorkerRole::kBoth);
  EXPECT_FALSE(AnySuspect(c, Request(10, 10), is_prefill));
}

TEST(LeastLoadedPolicyTest, RejectsBadRequestCounts) {
  auto policy = NewLeastLoadedPolicy();
  Candidates c = {Worker("b", WorkerRole::kBoth, 0, 100)};
  auto bad = policy->PickPrefill(c, Request(0, 10));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("prompt_tokens"));
  EXPECT_EQ(policy->PickDecode(c, Request(5, -1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RoundRobinPolicyTest, CyclesInIdOrderPerPhase) {
  auto policy = NewRoundRobinPolicy();
  Candidates c = {Worker("w2", WorkerRole::kBoth, 0, 100),
                  Worker("w1", WorkerRole::kBoth, 0, 100),
                  Worker("w3", WorkerRole::kDecode, 0, 100),
                  Worker("w4", WorkerRole::kDecode, 0, 1)};
  std::vector<std::string> prefill, decode;
  for (int i = 0; i < 4; ++i) {
    prefill.push_back(policy->PickPrefill(c, Request(10, 10))->id);
    decode.push_back(policy->PickDecode(c, Request(10, 10))->id);
  }
  EXPECT_THAT(prefill, ::testing::ElementsAre("w1", "w2", "w1", "w2"));
  // w4 has no room for 2 blocks.
  EXPECT_THAT(decode, ::testing::ElementsAre("w1", "w2", "w3", "w1"));
  EXPECT_EQ(policy->name(), "round_robin");
  EXPECT_EQ(policy->PickDecode({}, Request(1, 1)).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(PrefillLocallyTest, WhenThePickedDecodeWorkerHoldsAllButAFewTokens) {
  RequestInfo request = Request(300, 20);
  request.cached_tokens = {{"d1", 160}, {"d2", 288}};
  EXPECT_TRUE(PrefillLocally(request, "d2", 12));
  EXPECT_TRUE(PrefillLocally(request, "d2", 256));
  EXPECT_FALSE(PrefillLocally(request, "d2", 11));  // 12 tokens to compute
  EXPECT_FALSE(PrefillLocally(request, "d1", 139));
  EXPECT_TRUE(PrefillLocally(request, "d1", 140));
  // Holding nothing, or turned off: never, however short the prompt.
  EXPECT_FALSE(PrefillLocally(request, "d3", 1000));
  EXPECT_FALSE(PrefillLocally(request, "d2", 0));
  request.cached_tokens["d3"] = 0;
  EXPECT_FALSE(PrefillLocally(request, "d3", 1000));
}

}  // namespace
}  // namespace baton::coordinator
