// Prefill/decode disaggregation under faults: a rejected layout, a corrupted
// layer, a sink that fails mid-transfer, a handoff that never completes (also
// with a TCP send stuck in the kernel), and cancels; every block must be free
// on both engines afterwards.
#include <poll.h>
#include <sys/socket.h>

#include <thread>

#include "worker/engine/disaggregation_test_util.h"
#include "worker/transport/kv_test_peer.h"
#include "worker/transport/socket_io.h"

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
  ImportOptions import_options;
  import_options.transfer_id = 7;
  import_options.num_prompt_tokens = static_cast<int64_t>(prompt.size());
  import_options.max_tokens = 8;
  import_options.on_landed = [&](absl::Status s) {
    landed_status = s;
    landed.Notify();
  };
  ASSERT_TRUE(decode->ReserveImport("w", import_options).ok());
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
}

TEST_F(DisaggregationTest, SinkFailureMidTransferFreesBothSides) {
  auto prefill = MakeEngine();
  auto decode = MakeEngine();
  auto receiver = StartReceiver(*decode);
  const std::vector<int32_t> prompt = Chat("Tell me about owls.");
  absl::Notification landed;
  absl::Status landed_status;
  ImportOptions import_options;
  import_options.transfer_id = 9;
  import_options.num_prompt_tokens = static_cast<int64_t>(prompt.size());
  import_options.max_tokens = 8;
  import_options.on_landed = [&](absl::Status s) {
    landed_status = s;
    landed.Notify();
  };
  ASSERT_TRUE(decode->ReserveImport("f", import_options).ok());
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
}

// Flips the checksum of layer `bad` (the payload itself is intact).
class CorruptingSender : public KvSender {
 public:
  CorruptingSender(std::unique_ptr<KvSender> inner, int64_t bad)
      : inner_(std::move(inner)), bad_(bad) {}
  absl::Status SendLayer(const KvTransferHeader& header,
                         std::span<const uint8_t> payload) override {
    return inner_->SendLayer(Corrupt(header), payload);
  }
  absl::Status SendLayerChunks(const KvTransferHeader& header,
                               std::span<const std::span<const uint8_t>> chunks,
                               KvReadGate* gate) override {
    return inner_->SendLayerChunks(Corrupt(header), chunks, gate);
  }
  absl::Status Finish() override { return inner_->Finish(); }
  void Abort(absl::Status reason) override { inner_->Abort(reason); }

 private:
  KvTransferHeader Corrupt(KvTransferHeader h) const {
    if (h.layer == bad_) h.checksum ^= 1;
    return h;
  }
  std::unique_ptr<KvSender> inner_;
  int64_t bad_;
};

TEST_F(DisaggregationTest, ChecksumMismatchInPlaceCommitsNothing) {
  auto prefill = MakeEngine();
  auto decode = MakeEngine();
  auto receiver = StartReceiver(*decode);
  const std::vector<int32_t> prompt =
      Chat("Summarize: " + Repeat("The river runs past the old mill. ", 12));
  absl::Notification landed;
  absl::Status landed_status;
  ImportOptions import_options =
      Import(5, static_cast<int64_t>(prompt.size()), 8);
  import_options.on_landed = [&](absl::Status s) {
    landed_status = s;
    landed.Notify();
  };
  ASSERT_TRUE(decode->ReserveImport("x", import_options).ok());
  const std::string endpoint = receiver->endpoint();
  PrefillOptions options;
  options.make_sink =
      [endpoint](
          const KvSinkInfo& info) -> absl::StatusOr<std::unique_ptr<KvSink>> {
    auto sender = TcpKvSender::Connect(endpoint, 5);
    if (!sender.ok()) return sender.status();
    return std::unique_ptr<KvSink>(std::make_unique<TransportKvSink>(
        std::make_unique<CorruptingSender>(std::move(*sender), 11), 5, "",
        info));
  };
  PrefillResult result;
  SamplingParams params;
  params.temperature = 0.0;
  params.max_tokens = 8;
  ASSERT_TRUE(prefill
                  ->SubmitPrefill({"x", prompt, params}, options,
                                  CollectPrefill(&result))
                  .ok());
  prefill->RunUntilIdle();
  ASSERT_TRUE(result.done);
  EXPECT_EQ(result.last.error.code(), absl::StatusCode::kDataLoss)
      << result.last.error;
  EXPECT_THAT(result.last.error.message(),
              HasSubstr("layer 11: checksum mismatch"));
  ASSERT_TRUE(landed.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_EQ(landed_status.code(), absl::StatusCode::kDataLoss);
  // Layer 11's bytes landed in the reserved blocks, but the reservation was
  // freed without ever being committed (the failed import waits for the
  // decode request to collect its error), and cannot be decoded from.
  EXPECT_EQ(decode->stats().kv_blocks_free, decode->stats().kv_blocks_total);
  EXPECT_EQ(decode->stats().num_imports, 1);
  const absl::Status start =
      decode->StartImportedDecode({"x", prompt, params}, {1}, nullptr);
  EXPECT_EQ(start.code(), absl::StatusCode::kDataLoss) << start;
  EXPECT_THAT(start.message(), HasSubstr("checksum mismatch"));
  ExpectAllFree(*prefill);
  ExpectAllFree(*decode);
}

TEST_F(DisaggregationTest, HandoffTimeoutWhileTcpSendIsStuck) {
  // A peer that answers the hello and then never reads: the sender's
  // sendmsg fills the socket buffers and waits. The timeout must free the
  // blocks at once (the send waits outside the pool's read gate), not once the
  // send ends: the sender's stall timeout is an hour and the peer goes away
  // only after the engine is idle, so a handoff that waited for the sender
  // would hang here (ctest's timeout) instead of ending on its own.
  int port = 0;
  auto listener = TcpListen("127.0.0.1", 0, &port);
  ASSERT_TRUE(listener.ok()) << listener.status();
  UniqueFd peer;
  std::thread answer([&] {
    SocketIoOptions io;
    io.stall_timeout = absl::Seconds(60);
    if (!WaitFd(listener->get(), POLLIN, io, "accept").ok()) return;
    peer = UniqueFd(accept4(listener->get(), nullptr, nullptr, SOCK_NONBLOCK));
    EXPECT_TRUE(kvtest::AnswerHello(peer.get(), io).ok());
  });
  auto prefill = MakeEngine();
  PrefillOptions options;
  options.timeout = std::chrono::milliseconds(300);
  options.make_sink = TcpKvSinkFactory("127.0.0.1:" + std::to_string(port), 6,
                                       "", {.stall_timeout = absl::Hours(1)});
  PrefillResult result;
  SamplingParams params;
  params.temperature = 0.0;
  // ~450 tokens: ~10 MB of KV, far beyond what the socket buffers hold.
  const std::vector<int32_t> prompt =
      Chat("Continue the story: " +
           Repeat("A fox met a crow who held some cheese. ", 40));
  ASSERT_GT(prompt.size(), 400u);
  ASSERT_TRUE(prefill
                  ->SubmitPrefill({"s", prompt, params}, options,
                                  CollectPrefill(&result))
                  .ok());
  prefill->RunUntilIdle();
  ASSERT_TRUE(result.done);
  EXPECT_TRUE(absl::IsDeadlineExceeded(result.last.error)) << result.last.error;
  EXPECT_THAT(result.last.error.message(),
              HasSubstr("was not confirmed within 0.3 s"));
  ExpectAllFree(*prefill);
  // Closing the peer resets the connection; the detached sender ends and
  // the engine joins it.
  answer.join();
  peer.Reset();
  listener->Reset();
  prefill.reset();
}

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
  ImportOptions import_options;
  import_options.transfer_id = 3;
  import_options.num_prompt_tokens = 100;
  import_options.max_tokens = 50;
  auto reservation = decode->ReserveImport("c", import_options);
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
