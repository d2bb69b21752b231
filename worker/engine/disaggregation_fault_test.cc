// Prefill/decode disaggregation under faults: a rejected layout, a sink that
// fails mid-transfer, a handoff that never completes, and cancels; every
// block must be free on both engines afterwards.
#include "worker/engine/disaggregation_test_util.h"

namespace baton {
namespace {

using namespace ::baton::disagg_test;  // NOLINT(build/namespaces): fixtures
using ::testing::HasSubstr;

TEST_F(DisaggregationTest, ReceiverRejectsWrongLayoutFreesBothSides) {
  auto prefill = MakeEngine(512, /*block_size=*/8);
  auto decode = MakeEngine(512, /*block_size=*/16);
  auto receiver = StartReceiver(*decode);
  const std::vector<int32_t> prompt = Chat("Hello there");
  absl::Notification landed;
  absl::Status landed_status;
  ImportOptions import;
  import.transfer_id = 7;
  import.num_prompt_tokens = static_cast<int64_t>(prompt.size());
  import.max_tokens = 8;
  import.on_landed = [&](absl::Status s) { landed_status = s;
  landed.Notify();
};
ASSERT_TRUE(decode->ReserveImport("w", import).ok());
EXPECT_LT(decode->stats().kv_blocks_free, decode->stats().kv_blocks_total);
PrefillResult result;
PrefillOptions options;
options.make_sink = TcpKvSinkFactory(receiver->endpoint(), 7);
SamplingParams params;
params.temperature = 0.0;
params.max_tokens = 8;
ASSERT_TRUE(prefill
                ->SubmitPrefill({"w", prompt, params}, options,
                                CollectPrefill(&result))
                .ok());
prefill->RunUntilIdle();
ASSERT_TRUE(result.done);
EXPECT_EQ(result.last.finish_reason, FinishReason::kError);
EXPECT_THAT(result.last.error.message(), HasSubstr("block_size"));
ASSERT_TRUE(landed.WaitForNotificationWithTimeout(absl::Seconds(20)));
EXPECT_THAT(landed_status.message(), HasSubstr("block_size"));
const absl::Status start =
    decode->StartImportedDecode({"w", prompt, params}, {1}, nullptr);
EXPECT_THAT(start.message(), HasSubstr("block_size"));
ExpectAllFree(*prefill);
ExpectAllFree(*decode);
}  // namespace

TEST_F(DisaggregationTest, SinkFailureMidTransferFreesBothSides) {
  auto prefill = MakeEngine();
  auto decode = MakeEngine();
  auto receiver = StartReceiver(*decode);
  const std::vector<int32_t> prompt = Chat("Tell me about owls.");
  absl::Notification landed;
  absl::Status landed_status;
  ImportOptions import;
  import.transfer_id = 9;
  import.num_prompt_tokens = static_cast<int64_t>(prompt.size());
  import.max_tokens = 8;
  import.on_landed = [&](absl::Status s) { landed_status = s;
  landed.Notify();
};
ASSERT_TRUE(decode->ReserveImport("f", import).ok());
KvSinkFactory tcp = TcpKvSinkFactory(receiver->endpoint(), 9);
PrefillOptions options;
options.make_sink =
    [tcp](const KvSinkInfo& info) -> absl::StatusOr<std::unique_ptr<KvSink>> {
  auto inner = tcp(info);
  if (!inner.ok()) return inner.status();
  return std::unique_ptr<KvSink>(
      std::make_unique<FailingSink>(std::move(*inner), 7));
};
PrefillResult result;
SamplingParams params;
params.temperature = 0.0;
params.max_tokens = 8;
ASSERT_TRUE(prefill
                ->SubmitPrefill({"f", prompt, params}, options,
                                CollectPrefill(&result))
                .ok());
prefill->RunUntilIdle();
ASSERT_TRUE(result.done);
EXPECT_TRUE(result.first.has_value());
EXPECT_EQ(result.last.finish_reason, FinishReason::kError);
EXPECT_THAT(result.last.error.message(),
            HasSubstr("injected sink failure at layer 7"));
ASSERT_TRUE(landed.WaitForNotificationWithTimeout(absl::Seconds(20)));
EXPECT_THAT(landed_status.message(), HasSubstr("injected sink failure"));
const absl::Status start =
    decode->StartImportedDecode({"f", prompt, params}, {1}, nullptr);
EXPECT_THAT(start.message(), HasSubstr("injected sink failure"));
ExpectAllFree(*prefill);
ExpectAllFree(*decode);
}  // namespace baton

TEST_F(DisaggregationTest, HandoffTimeoutFreesBlocksWithoutWaiting) {
  auto prefill = MakeEngine();
  absl::Notification release;
  PrefillOptions options;
  options.timeout = std::chrono::milliseconds(200);
  options.make_sink =
      [&release](const KvSinkInfo&) -> absl::StatusOr<std::unique_ptr<KvSink>> {
    return std::unique_ptr<KvSink>(std::make_unique<StuckSink>(&release));
  };
  PrefillResult result;
  SamplingParams params;
  params.temperature = 0.0;
  ASSERT_TRUE(prefill
                  ->SubmitPrefill({"t", Chat("Hi"), params}, options,
                                  CollectPrefill(&result))
                  .ok());
  prefill->RunUntilIdle();
  ASSERT_TRUE(result.done);
  EXPECT_TRUE(absl::IsDeadlineExceeded(result.last.error)) << result.last.error;
  ExpectAllFree(*prefill);
  release.Notify();  // the detached sender thread ends; the engine joins it
  prefill.reset();
}

TEST_F(DisaggregationTest, CancelBeforeDecodeFreesReservation) {
  auto decode = MakeEngine();
  ImportOptions import;
  import.transfer_id = 3;
  import.num_prompt_tokens = 100;
  import.max_tokens = 50;
  auto reservation = decode->ReserveImport("c", import);
  ASSERT_TRUE(reservation.ok()) << reservation.status();
  EXPECT_EQ(reservation->num_blocks, 10);
  EXPECT_EQ(decode->stats().kv_blocks_free,
            decode->stats().kv_blocks_total - 10);
  // The id and the transfer id are taken while reserved.
  EXPECT_FALSE(decode->ReserveImport("c", Import(4, 1, 1)).ok());
  decode->Cancel("c");
  ExpectAllFree(*decode);
  EXPECT_TRUE(absl::IsNotFound(decode->ImportTarget(3).status()));
  // Too large for the pool: refused before any transfer.
  auto big = decode->ReserveImport("big", Import(5, 4000, 200));
  EXPECT_TRUE(absl::IsResourceExhausted(big.status())) << big.status();
  ExpectAllFree(*decode);
}

TEST_F(DisaggregationTest, CancelQueuedPrefillEndsItCancelled) {
  auto prefill = MakeEngine();
  PrefillResult result;
  PrefillOptions options;
  options.make_sink =
      [](const KvSinkInfo&) -> absl::StatusOr<std::unique_ptr<KvSink>> {
    return absl::InternalError("must not open");
  };
  SamplingParams params;
  ASSERT_TRUE(prefill
                  ->SubmitPrefill({"q", Chat("Hi"), params}, options,
                                  CollectPrefill(&result))
                  .ok());
  prefill->Cancel("q");
  prefill->RunUntilIdle();
  ASSERT_TRUE(result.done);
  EXPECT_FALSE(result.first.has_value());
  EXPECT_EQ(result.last.finish_reason, FinishReason::kCancelled);
  ExpectAllFree(*prefill);
}

}  // namespace
}  // namespace baton
