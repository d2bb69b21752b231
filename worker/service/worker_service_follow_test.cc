// A split Prefill whose KV target follows it (kv_target_follows, then
// SetKvTarget): the prompt is computed before the target comes, its KV
// leaves once it does, and the tokens are those of a target sent with the
// Prefill; a target that never comes fails the handoff and frees every
// block; SetKvTarget's errors name the request; a worker that goes ends
// every wait.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/service/following_kv_targets.h"
#include "worker/service/worker_service.h"
#include "worker/service/worker_service_test_fixture.h"

namespace baton::worker_service_test {
namespace {

using ::testing::HasSubstr;

class WorkerServiceFollowTest : public WorkerServiceTest {
 protected:
  static v1::ReserveKvResponse Reserve(TestWorker& decode,
                                       const std::string& id,
                                       const std::vector<int32_t>& prompt) {
    v1::ReserveKvRequest reserve;
    reserve.set_request_id(id);
    reserve.set_model_id("smollm2");
    reserve.set_num_prompt_tokens(static_cast<int32_t>(prompt.size()));
    reserve.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
    reserve.set_max_tokens(kMaxTokens);
    v1::ReserveKvResponse reserved;
    auto context = Context();
    const grpc::Status status =
        decode.stub->ReserveKv(context.get(), reserve, &reserved);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return reserved;
  }

  static v1::PrefillRequest FollowingPrefill(
      const std::string& id, const std::vector<int32_t>& prompt) {
    v1::PrefillRequest request;
    request.set_request_id(id);
    request.set_model_id("smollm2");
    request.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
    *request.mutable_sampling() = Greedy();
    request.mutable_kv_target()->mutable_decode_worker()->set_worker_id("d");
    request.set_kv_target_follows(true);
    return request;
  }

  static grpc::Status SetTarget(TestWorker& prefill, const std::string& id,
                                const v1::ReserveKvResponse& reserved) {
    v1::SetKvTargetRequest request;
    request.set_request_id(id);
    *request.mutable_kv_target()->mutable_endpoint() = reserved.endpoint();
    request.mutable_kv_target()->set_transfer_id(reserved.transfer_id());
    request.mutable_kv_target()->set_transfer_secret(
        reserved.transfer_secret());
    request.mutable_kv_target()->set_first_block(reserved.cached_blocks());
    v1::SetKvTargetResponse response;
    auto context = Context();
    return prefill.stub->SetKvTarget(context.get(), request, &response);
  }
};

// The first token arrives before the target is sent; the handoff waits for
// it. The decode worker holds the prompt's leading blocks from the turn
// before, and only the rest moves (the target's first_block).
TEST_F(WorkerServiceFollowTest, TheKvLeavesOnceItsTargetComes) {
  auto prefill = StartWorker(v1::WORKER_ROLE_PREFILL);
  auto decode = StartWorker(v1::WORKER_ROLE_DECODE);
  ASSERT_NE(prefill, nullptr);
  ASSERT_NE(decode, nullptr);
  const std::vector<int32_t> prompt =
      Prompt("Name three colors, then three animals, then three cities.");
  v1::ReserveKvResponse sent_with;
  v1::PrefillHandoff whole;
  const std::vector<int32_t> expected = Split(
      *prefill, *decode, "with-target", prompt, &sent_with, nullptr, &whole);
  ASSERT_EQ(expected.size(), static_cast<size_t>(kMaxTokens));
  // Every block of the prompt moved that time.
  ASSERT_EQ(sent_with.cached_blocks(), 0);
  const int64_t block_size = prefill->engine->kv_cache().layout().block_size;
  const int64_t blocks =
      (static_cast<int64_t>(prompt.size()) + block_size - 1) / block_size;
  ASSERT_EQ(whole.kv_transfer_bytes() % blocks, 0);
  const int64_t block_bytes = whole.kv_transfer_bytes() / blocks;

  for (const char* id : {"follows-1", "follows-2"}) {
    SCOPED_TRACE(id);
    auto context = Context();
    auto reader =
        prefill->stub->Prefill(context.get(), FollowingPrefill(id, prompt));
    v1::PrefillResponse message;
    ASSERT_TRUE(reader->Read(&message));
    ASSERT_TRUE(message.has_first_token());
    EXPECT_EQ(message.first_token().token_id(), expected[0]);
    const v1::ReserveKvResponse reserved = Reserve(*decode, id, prompt);
    ASSERT_TRUE(SetTarget(*prefill, id, reserved).ok());
    ASSERT_TRUE(reader->Read(&message));
    ASSERT_TRUE(message.has_handoff());
    // The decode worker cached the prompt's blocks from the turn before:
    // only the rest moves, and only that is counted.
    EXPECT_GT(reserved.cached_blocks(), 0);
    EXPECT_EQ(message.handoff().kv_transfer_bytes(),
              (blocks - reserved.cached_blocks()) * block_bytes);
    const grpc::Status status = reader->Finish();
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(DecodeAfter(*decode, id, prompt, reserved, expected[0]),
              expected);
  }
  EXPECT_EQ(prefill->WaitAllFree().kv_blocks_free(),
            prefill->Load().kv_blocks_total());
  EXPECT_EQ(decode->WaitAllFree().kv_blocks_free(),
            decode->Load().kv_blocks_total());
}

// No target within the handoff timeout: the Prefill fails naming it, and
// the prompt's blocks are freed.
TEST_F(WorkerServiceFollowTest, ATargetThatNeverComesFreesTheBlocks) {
  auto prefill = StartWorker(v1::WORKER_ROLE_PREFILL, nullptr,
                             [](Engine&, WorkerServiceOptions& options) {
                               options.handoff_timeout =
                                   std::chrono::milliseconds(300);
                             });
  ASSERT_NE(prefill, nullptr);
  const std::vector<int32_t> prompt = Prompt("Name three colors.");
  auto context = Context();
  auto reader =
      prefill->stub->Prefill(context.get(), FollowingPrefill("never", prompt));
  v1::PrefillResponse message;
  while (reader->Read(&message)) {
  }
  const grpc::Status status = reader->Finish();
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.error_message(), HasSubstr("never"));
  const v1::WorkerLoad load = prefill->WaitAllFree();
  EXPECT_EQ(load.kv_blocks_free(), load.kv_blocks_total());
}

// The target may come before its Prefill (two calls; a long prompt may
// still be on the wire): the Prefill finds it and hands off at once.
TEST_F(WorkerServiceFollowTest, ATargetBeforeItsPrefillIsKept) {
  auto prefill = StartWorker(v1::WORKER_ROLE_PREFILL);
  auto decode = StartWorker(v1::WORKER_ROLE_DECODE);
  ASSERT_NE(prefill, nullptr);
  ASSERT_NE(decode, nullptr);
  const std::vector<int32_t> prompt = Prompt("Name three colors.");
  v1::ReserveKvResponse sent_with;
  const std::vector<int32_t> expected =
      Split(*prefill, *decode, "with-target", prompt, &sent_with);
  const v1::ReserveKvResponse reserved = Reserve(*decode, "early", prompt);
  ASSERT_TRUE(SetTarget(*prefill, "early", reserved).ok());
  int32_t first = -1;
  bool handoff = false;
  const grpc::Status status =
      RunPrefill(*prefill, FollowingPrefill("early", prompt), &first, &handoff);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(handoff);
  EXPECT_EQ(DecodeAfter(*decode, "early", prompt, reserved, first), expected);
}

TEST_F(WorkerServiceFollowTest, SetKvTargetNamesWhatIsWrong) {
  auto prefill = StartWorker(v1::WORKER_ROLE_PREFILL);
  ASSERT_NE(prefill, nullptr);
  v1::ReserveKvResponse target;
  target.mutable_endpoint()->set_address("127.0.0.1:1");
  target.set_transfer_id("12");
  ASSERT_TRUE(SetTarget(*prefill, "twice", target).ok());
  const grpc::Status twice = SetTarget(*prefill, "twice", target);
  EXPECT_EQ(twice.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(twice.error_message(), HasSubstr("twice"));
  target.set_transfer_id("not-a-number");
  const grpc::Status bad = SetTarget(*prefill, "other", target);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("transfer_id"));
  target.set_transfer_id("12");
  target.mutable_endpoint()->clear_address();
  EXPECT_THAT(SetTarget(*prefill, "other", target).error_message(),
              HasSubstr("HOST_TCP"));
  EXPECT_EQ(SetTarget(*prefill, "", target).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// A Prefill waiting for its target takes one: a second is refused while
// the first is kept, and the wait ends with the first.
TEST(FollowingKvTargetsTest, ASecondTargetIsRefused) {
  FollowingKvTargets targets(absl::Hours(1));
  ASSERT_TRUE(targets.Expect("r").ok());
  v1::KvTarget target;
  target.mutable_endpoint()->set_address("127.0.0.1:1");
  target.set_transfer_id("12");
  ASSERT_TRUE(targets.Deliver("r", target).ok());
  v1::KvTarget other = target;
  other.set_transfer_id("13");
  EXPECT_EQ(targets.Deliver("r", other).code(),
            absl::StatusCode::kFailedPrecondition);
  const absl::StatusOr<v1::KvTarget> got = targets.Await("r", absl::Hours(1));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->transfer_id(), "12");
}

// The worker going ends a wait at once (not at the handoff timeout), and
// no Prefill or target is taken after it.
TEST(FollowingKvTargetsTest, CloseEndsEveryWaitAndRefusesNewOnes) {
  FollowingKvTargets targets(absl::Hours(1));
  ASSERT_TRUE(targets.Expect("waiting").ok());
  absl::Status ended;
  std::thread waiter(
      [&] { ended = targets.Await("waiting", absl::Hours(1)).status(); });
  targets.Close(absl::UnavailableError("worker shutting down"));
  waiter.join();
  EXPECT_EQ(ended.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(ended.message(), HasSubstr("shutting down"));
  EXPECT_EQ(targets.Expect("later").code(), absl::StatusCode::kUnavailable);
  v1::KvTarget target;
  target.mutable_endpoint()->set_address("127.0.0.1:1");
  target.set_transfer_id("12");
  EXPECT_EQ(targets.Deliver("later", target).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(targets.Await("later", absl::Hours(1)).status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace baton::worker_service_test
