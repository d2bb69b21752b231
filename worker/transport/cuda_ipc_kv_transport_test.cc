// The CUDA IPC KV transport's protocol over FakeCudaIpcApi: every layer lands
// byte for byte, every rejection comes before any byte is written, and
// stalls, aborts and dead peers end transfers within their deadlines.
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/transport/cuda_ipc_kv_transport_test_harness.h"

namespace baton::cuda_ipc_test {
namespace {

using ::testing::HasSubstr;

TEST_F(CudaIpcKvTransportTest, TransfersEveryLayerIntoTheDevicePool) {
  h_.StartReceiver();
  auto sender = h_.Connect(7);
  ASSERT_NE(sender, nullptr);
  const std::vector<uint8_t> layer0 = h_.Exported(0);
  ASSERT_TRUE(sender->SendLayer(h_.Header(7, 0), layer0).ok());
  ASSERT_TRUE(sender->SendLayerFromPool(h_.Header(7, 1), h_.Source()).ok());
  const auto chunks = h_.Chunks(2);
  ASSERT_TRUE(sender->SendLayerChunks(h_.Header(7, 2), chunks, nullptr).ok());
  ASSERT_TRUE(sender->SendLayerFromPool(h_.Header(7, 3), h_.Source()).ok());
  ASSERT_TRUE(sender->Finish().ok());
  auto done = h_.DoneStatus(7);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(done->ok()) << *done;
  EXPECT_THAT(h_.layers(), ::testing::ElementsAre(0, 1, 2, 3));
  EXPECT_TRUE(h_.ReceiverHolds({0, 1, 2, 3}));
  EXPECT_EQ(h_.api_.num_exports(), 1);
  EXPECT_EQ(h_.api_.num_opens(), 1);
  EXPECT_EQ(h_.receiver_->num_exported_pools(), 1);
}

TEST_F(CudaIpcKvTransportTest, OneMappingServesEveryTransferAndClosesLast) {
  h_.StartReceiver();
  for (uint64_t id : {1, 2, 3}) {
    auto sender = h_.Connect(id);
    ASSERT_NE(sender, nullptr);
    ASSERT_TRUE(h_.SendAll(*sender, id).ok());
  }
  EXPECT_TRUE(h_.ReceiverHolds({0, 1, 2, 3}));
  EXPECT_EQ(h_.api_.num_exports(), 1);
  EXPECT_EQ(h_.api_.num_opens(), 1);
  EXPECT_EQ(h_.mappings_->num_cached(), 1);
  EXPECT_EQ(h_.api_.num_closes(), 0);
  h_.mappings_.reset();
  EXPECT_EQ(h_.api_.num_closes(), 1);
  EXPECT_EQ(h_.api_.num_open(), 0);
}

TEST_F(CudaIpcKvTransportTest, ConcurrentTransfersShareOneMapping) {
  h_.StartReceiver();
  absl::Status a, b;
  std::thread ta([&] {
    auto s = h_.Connect(1);
    a = s ? h_.SendAll(*s, 1) : absl::InternalError("connect");
  });
  std::thread tb([&] {
    auto s = h_.Connect(kSecondId);
    b = s ? h_.SendAll(*s, kSecondId) : absl::InternalError("connect");
  });
  ta.join();
  tb.join();
  EXPECT_TRUE(a.ok()) << a;
  EXPECT_TRUE(b.ok()) << b;
  EXPECT_TRUE(
      h_.ReceiverHolds({0, 1, 2, 3}, {&h_.recv_table_, &h_.second_table_}));
  EXPECT_EQ(h_.api_.num_opens(), 1);
}

TEST_F(CudaIpcKvTransportTest, WrongModelIsRejectedBeforeAnyByteLands) {
  h_.StartReceiver({}, "llama-3");
  auto sender = h_.Connect(1);
  ASSERT_NE(sender, nullptr);
  const absl::Status s =
      sender->SendLayerFromPool(h_.Header(1, 0), h_.Source());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model_id 'smollm'"));
  EXPECT_THAT(s.message(), HasSubstr("llama-3"));
  EXPECT_EQ(sender->SendLayerFromPool(h_.Header(1, 1), h_.Source()), s);
  EXPECT_EQ(sender->Finish(), s);
  EXPECT_EQ(h_.DoneStatus(1)->code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(h_.ReceiverHolds({}));
  EXPECT_TRUE(h_.layers().empty());
  EXPECT_EQ(h_.api_.num_copies(), 0);
  EXPECT_EQ(h_.api_.num_opens(), 0);  // no grant, nothing opened
}

TEST_F(CudaIpcKvTransportTest, WrongLayoutIsRejected) {
  h_.StartReceiver();
  auto sender = h_.Connect(2);
  ASSERT_NE(sender, nullptr);
  KvTransferHeader header = h_.Header(2, 0);
  header.layout.head_dim = 16;  // the sender claims another model shape
  header.payload_bytes *= 2;
  std::vector<uint8_t> payload(header.payload_bytes, 0x77);
  const absl::Status s = sender->SendLayer(header, payload);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("head_dim 16 vs expected 8"));
  EXPECT_TRUE(h_.ReceiverHolds({}));
  EXPECT_EQ(h_.api_.num_copies(), 0);
}

TEST_F(CudaIpcKvTransportTest, LayerSentTwiceIsRejectedAndKeepsTheFirst) {
  h_.StartReceiver();
  auto sender = h_.Connect(3);
  ASSERT_NE(sender, nullptr);
  ASSERT_TRUE(sender->SendLayerFromPool(h_.Header(3, 1), h_.Source()).ok());
  const absl::Status s =
      sender->SendLayerFromPool(h_.Header(3, 1), h_.Source());
  EXPECT_THAT(s.message(), HasSubstr("layer 1 sent twice"));
  EXPECT_EQ(h_.DoneStatus(3)->code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(h_.ReceiverHolds({1}));
  EXPECT_EQ(h_.api_.num_copies(), 1);  // one layer: 3 adjacent chunks, 1 run
}

TEST_F(CudaIpcKvTransportTest, ShortReservationIsRejected) {
  h_.StartReceiver();
  auto sender = h_.Connect(kShortId);
  ASSERT_NE(sender, nullptr);
  const absl::Status s =
      sender->SendLayerFromPool(h_.Header(kShortId, 0), h_.Source());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("reserved table holds 1 blocks, 3"));
  EXPECT_TRUE(h_.ReceiverHolds({}));
}

TEST_F(CudaIpcKvTransportTest, UnknownTransferIsRejected) {
  h_.StartReceiver();
  auto sender = h_.Connect(100);
  ASSERT_NE(sender, nullptr);
  const absl::Status s =
      sender->SendLayerFromPool(h_.Header(100, 0), h_.Source());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("no reservation"));
  // Not a transfer of this receiver: nothing to report.
  EXPECT_FALSE(h_.Reported(100));
}

// Only the sender holding the reservation's secret may write: a wrong
// secret is refused before any grant; a second connection
// quoting a transfer another connection holds is refused (even with the
// secret) without touching it; neither is reported, and the first
// transfer completes.
TEST_F(CudaIpcKvTransportTest, OnlyTheInvitedConnectionWrites) {
  h_.StartReceiver({}, "smollm", "the-secret");
  CudaIpcKvSenderOptions guess;
  guess.transfer_secret = "a-guess";
  auto rogue = CudaIpcKvSender::Connect(h_.mappings_.get(),
                                        h_.receiver_->endpoint(), 1, guess);
  absl::Status refused = rogue.status();
  if (refused.ok()) {
    refused = (*rogue)->SendLayerFromPool(h_.Header(1, 0), h_.Source());
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated) << refused;
  EXPECT_EQ(h_.api_.num_exports(), 0);  // no grant went out
  CudaIpcKvSenderOptions invited;
  invited.transfer_secret = "the-secret";
  auto sender = h_.Connect(1, invited);
  ASSERT_NE(sender, nullptr);
  ASSERT_TRUE(sender->SendLayerFromPool(h_.Header(1, 0), h_.Source()).ok());
  auto second = CudaIpcKvSender::Connect(h_.mappings_.get(),
                                         h_.receiver_->endpoint(), 1, invited);
  absl::Status s = second.status();
  if (s.ok()) s = (*second)->SendLayerFromPool(h_.Header(1, 1), h_.Source());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("another connection"));
  EXPECT_FALSE(h_.Reported(1));
  for (int64_t l = 1; l < 4; ++l) {
    ASSERT_TRUE(sender->SendLayerFromPool(h_.Header(1, l), h_.Source()).ok());
  }
  EXPECT_TRUE(sender->Finish().ok());
  EXPECT_TRUE(h_.DoneStatus(1)->ok());
}

TEST_F(CudaIpcKvTransportTest, FinishWithoutEveryLayerFails) {
  h_.StartReceiver();
  auto sender = h_.Connect(5);
  ASSERT_NE(sender, nullptr);
  ASSERT_TRUE(sender->SendLayerFromPool(h_.Header(5, 0), h_.Source()).ok());
  ASSERT_TRUE(sender->SendLayerFromPool(h_.Header(5, 2), h_.Source()).ok());
  const absl::Status s = sender->Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("layer 1 is missing"));
  EXPECT_EQ(h_.DoneStatus(5)->code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(CudaIpcKvTransportTest, CallerErrorsSendNothingAndKeepTheTransfer) {
  h_.StartReceiver();
  auto sender = h_.Connect(6);
  ASSERT_NE(sender, nullptr);
  EXPECT_EQ(sender->SendLayerFromPool(h_.Header(9, 0), h_.Source()).code(),
            absl::StatusCode::kInvalidArgument);  // another transfer's id
  EXPECT_THAT(sender->SendLayerFromPool(h_.Header(6, 4), h_.Source()).message(),
              HasSubstr("layer 4 not in [0, 4)"));
  KvTransferHeader short_payload = h_.Header(6, 0);
  short_payload.payload_bytes -= 1;
  EXPECT_EQ(sender->SendLayerFromPool(short_payload, h_.Source()).code(),
            absl::StatusCode::kInvalidArgument);
  KvDeviceLayerSource bad = h_.Source();
  const int32_t ids[3] = {0, 1, 99};
  bad.block_ids = ids;
  EXPECT_THAT(sender->SendLayerFromPool(h_.Header(6, 0), bad).message(),
              HasSubstr("source block id 99"));
  EXPECT_TRUE(h_.SendAll(*sender, 6).ok());
  EXPECT_TRUE(h_.ReceiverHolds({0, 1, 2, 3}));
}

TEST_F(CudaIpcKvTransportTest, SenderAbortReachesTheReceiver) {
  h_.StartReceiver();
  auto sender = h_.Connect(8);
  ASSERT_NE(sender, nullptr);
  ASSERT_TRUE(sender->SendLayerFromPool(h_.Header(8, 0), h_.Source()).ok());
  sender->Abort(absl::CancelledError("client went away"));
  auto done = h_.DoneStatus(8);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(done->message(), HasSubstr("client went away"));
  EXPECT_EQ(sender->Finish().code(), absl::StatusCode::kCancelled);
}

TEST_F(CudaIpcKvTransportTest, DestroyedSenderAborts) {
  h_.StartReceiver();
  auto sender = h_.Connect(9);
  ASSERT_NE(sender, nullptr);
  ASSERT_TRUE(sender->SendLayerFromPool(h_.Header(9, 0), h_.Source()).ok());
  sender.reset();
  EXPECT_EQ(h_.DoneStatus(9)->code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(h_.api_.num_streams(), 0);
}

TEST_F(CudaIpcKvTransportTest, StalledCopyFailsBothSidesWithinTheDeadline) {
  // landed_timeout far above the sender's copy wait: only the sender's
  // deadline can end the layer; the receiver learns it from the abort.
  CudaIpcKvReceiverOptions options;
  options.landed_timeout = absl::Seconds(60);
  h_.StartReceiver(options);
  CudaIpcKvSenderOptions sender_options;
  sender_options.stall_timeout = absl::Milliseconds(100);
  auto sender = h_.Connect(10, sender_options);
  ASSERT_NE(sender, nullptr);
  h_.api_.SetStallCopies(true);
  const absl::Status s =
      sender->SendLayerFromPool(h_.Header(10, 0), h_.Source());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(),
              HasSubstr("layer 0: device copy not complete at the deadline"));
  auto done = h_.DoneStatus(10);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(done->message(), HasSubstr("aborted by sender"));
  EXPECT_THAT(done->message(),
              HasSubstr("device copy not complete at the deadline"));
  EXPECT_EQ(h_.layers().size(), 0u);
  h_.api_.SetStallCopies(false);  // the late copy drains
  sender.reset();
  EXPECT_EQ(h_.api_.num_streams(), 0);
}

TEST_F(CudaIpcKvTransportTest, CopyAndOpenErrorsAbortTheTransfer) {
  h_.StartReceiver();
  auto sender = h_.Connect(11);
  ASSERT_NE(sender, nullptr);
  h_.api_.FailNextOpen(absl::InternalError("no peer access"));
  absl::Status s = sender->SendLayerFromPool(h_.Header(11, 0), h_.Source());
  EXPECT_THAT(s.message(), HasSubstr("no peer access"));
  EXPECT_THAT(h_.DoneStatus(11)->message(), HasSubstr("no peer access"));

  sender = h_.Connect(12);
  ASSERT_NE(sender, nullptr);
  h_.api_.FailNextCopy(absl::InternalError("illegal address"));
  s = sender->SendLayerFromPool(h_.Header(12, 0), h_.Source());
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(h_.DoneStatus(12)->message(), HasSubstr("illegal address"));
  EXPECT_TRUE(h_.ReceiverHolds({}));
}

TEST_F(CudaIpcKvTransportTest, ExportFailureRejectsBeforeAnyGrant) {
  h_.StartReceiver();
  auto sender = h_.Connect(13);
  ASSERT_NE(sender, nullptr);
  h_.api_.FailNextExport(absl::InternalError("not cudaMalloc memory"));
  const absl::Status s =
      sender->SendLayerFromPool(h_.Header(13, 0), h_.Source());
  EXPECT_THAT(s.message(), HasSubstr("rejected transfer 13"));
  EXPECT_THAT(s.message(), HasSubstr("not cudaMalloc memory"));
  EXPECT_EQ(h_.api_.num_opens(), 0);
}

class RevokedGate : public KvReadGate {
 public:
  bool Enter() override { return false; }
  void Exit() override { ADD_FAILURE() << "Exit without Enter"; }
};

TEST_F(CudaIpcKvTransportTest, RevokedGateAbortsBeforeTheCopy) {
  h_.StartReceiver();
  auto sender = h_.Connect(14);
  ASSERT_NE(sender, nullptr);
  RevokedGate gate;
  const auto chunks = h_.Chunks(0);
  const absl::Status s =
      sender->SendLayerChunks(h_.Header(14, 0), chunks, &gate);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(h_.DoneStatus(14)->code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(h_.api_.num_copies(), 0);
}

TEST_F(CudaIpcKvTransportTest, SilentSenderTimesOutOnTheReceiver) {
  CudaIpcKvReceiverOptions options;
  options.stall_timeout = absl::Milliseconds(100);
  h_.StartReceiver(options);
  auto sender = h_.Connect(15);
  ASSERT_NE(sender, nullptr);
  ASSERT_TRUE(sender->SendLayerFromPool(h_.Header(15, 0), h_.Source()).ok());
  auto done = h_.DoneStatus(15, absl::Seconds(5));
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(sender->SendLayerFromPool(h_.Header(15, 1), h_.Source()).ok());
  EXPECT_TRUE(h_.ReceiverHolds({0}));  // landed, never committed
}

TEST_F(CudaIpcKvTransportTest, ReceiverShutdownCancelsAndEvictsTheMapping) {
  h_.StartReceiver();
  auto sender = h_.Connect(16);
  ASSERT_NE(sender, nullptr);
  ASSERT_TRUE(sender->SendLayerFromPool(h_.Header(16, 0), h_.Source()).ok());
  EXPECT_EQ(h_.mappings_->num_cached(), 1);
  h_.receiver_.reset();
  EXPECT_EQ(h_.DoneStatus(16)->code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(sender->SendLayerFromPool(h_.Header(16, 1), h_.Source()).ok());
  EXPECT_EQ(h_.mappings_->num_cached(), 0);
  EXPECT_EQ(h_.api_.num_closes(), 0);  // the sender still holds it
  sender.reset();
  EXPECT_EQ(h_.api_.num_closes(), 1);
}

TEST_F(CudaIpcKvTransportTest, RefusedConnectionIsUnavailable) {
  h_.StartReceiver();
  const std::string endpoint = h_.receiver_->endpoint();
  h_.receiver_.reset();
  auto sender = CudaIpcKvSender::Connect(h_.mappings_.get(), endpoint, 1);
  EXPECT_EQ(sender.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace baton::cuda_ipc_test
