#include "worker/transport/nccl_kv_transport.h"

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/transport/nccl_kv_transport_test_harness.h"

namespace baton {
namespace {

using nccl_kv_test::LoopbackNcclApi;
using nccl_kv_test::NcclKvTransportHarness;
using nccl_kv_test::RunFullTransfer;
using ::testing::HasSubstr;

class NcclKvTransportTest : public ::testing::Test {
 protected:
  LoopbackNcclApi api_;
  NcclKvTransportHarness h_{&api_, 0, 0};
};

TEST_F(NcclKvTransportTest, TransfersEveryLayerIntoTheDevicePool) {
  RunFullTransfer(h_);
  EXPECT_EQ(api_.aborts(), 0);
}

TEST_F(NcclKvTransportTest, WrongModelIsRejectedBeforeAnyByteLands) {
  h_.StartReceiver({}, "llama-3");
  ASSERT_TRUE(h_.receiver_->Expect(h_.handshake_, 1).ok());
  auto sender = NcclKvSender::Create(h_.send_pool_.get(), h_.handshake_, 1);
  ASSERT_TRUE(sender.ok()) << sender.status();
  const absl::Status s =
      (*sender)->SendLayerFromPool(h_.Header(1, 0), h_.Source());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model_id 'smollm'"));
  EXPECT_THAT(s.message(), HasSubstr("llama-3"));
  EXPECT_EQ((*sender)->SendLayerFromPool(h_.Header(1, 1), h_.Source()), s);
  auto done = h_.DoneStatus(1, absl::Seconds(10));
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(h_.ReceiverHolds({}));
  EXPECT_TRUE(h_.layers().empty());
  // A rejection ends the transfer, not the pair's communicator.
  EXPECT_EQ(api_.aborts(), 0);
}

TEST_F(NcclKvTransportTest, WrongLayoutIsRejected) {
  h_.StartReceiver();
  ASSERT_TRUE(h_.receiver_->Expect(h_.handshake_, 2).ok());
  auto sender = NcclKvSender::Create(h_.send_pool_.get(), h_.handshake_, 2);
  ASSERT_TRUE(sender.ok());
  KvTransferHeader header = h_.Header(2, 0);
  header.layout.head_dim = 16;  // sender claims another model shape
  header.payload_bytes *= 2;
  std::vector<uint8_t> fake(header.payload_bytes);
  const absl::Status s = (*sender)->SendLayer(header, fake);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("head_dim 16 vs expected 8"));
  EXPECT_TRUE(h_.ReceiverHolds({}));
}

TEST_F(NcclKvTransportTest, RejectionKeepsThePairUsableForTheNextTransfer) {
  h_.StartReceiver();
  ASSERT_TRUE(h_.receiver_->Expect(h_.handshake_, 3).ok());
  auto bad = NcclKvSender::Create(h_.send_pool_.get(), h_.handshake_, 3);
  ASSERT_TRUE(bad.ok());
  KvTransferHeader header = h_.Header(3, 0);
  header.layer = 9;  // only the receiver checks a contiguous payload's layer
  auto staged = h_.StageLayer(0);
  ASSERT_TRUE(staged.ok());
  EXPECT_THAT((*bad)->SendLayer(header, *staged).message(),
              HasSubstr("layer must be in [0, 4)"));
  ASSERT_TRUE(h_.receiver_->Expect(h_.handshake_, 4).ok());
  auto good = NcclKvSender::Create(h_.send_pool_.get(), h_.handshake_, 4);
  ASSERT_TRUE(good.ok());
  for (int64_t l = 0; l < 4; ++l) {
    ASSERT_TRUE((*good)->SendLayerFromPool(h_.Header(4, l), h_.Source()).ok());
  }
  EXPECT_TRUE((*good)->Finish().ok());
  EXPECT_TRUE(h_.ReceiverHolds({0, 1, 2, 3}));
}

TEST_F(NcclKvTransportTest, FinishWithoutEveryLayerFails) {
  h_.StartReceiver();
  ASSERT_TRUE(h_.receiver_->Expect(h_.handshake_, 5).ok());
  auto sender = NcclKvSender::Create(h_.send_pool_.get(), h_.handshake_, 5);
  ASSERT_TRUE(sender.ok());
  ASSERT_TRUE((*sender)->SendLayerFromPool(h_.Header(5, 0), h_.Source()).ok());
  ASSERT_TRUE((*sender)->SendLayerFromPool(h_.Header(5, 2), h_.Source()).ok());
  const absl::Status s = (*sender)->Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("2 of 4 layers; layer 1 is missing"));
  EXPECT_EQ(h_.DoneStatus(5, absl::Seconds(10))->code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(NcclKvTransportTest, UnknownTransferIsRejected) {
  h_.StartReceiver();
  ASSERT_TRUE(h_.receiver_->Expect(h_.handshake_, 100).ok());
  auto sender = NcclKvSender::Create(h_.send_pool_.get(), h_.handshake_, 100);
  ASSERT_TRUE(sender.ok());
  const absl::Status s =
      (*sender)->SendLayerFromPool(h_.Header(100, 0), h_.Source());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("no reservation"));
}

// A transfer is bound to the pair that expected it (PairKv proved its
// sender holds the secret): frames of any other transfer on the pair are
// refused without a lookup and not reported, and the pair goes on.
TEST_F(NcclKvTransportTest, TransferNotExpectedOnThePairIsRefused) {
  h_.StartReceiver();
  ASSERT_TRUE(h_.receiver_->Expect(h_.handshake_, 12).ok());
  auto rogue = NcclKvSender::Create(h_.send_pool_.get(), h_.handshake_, 13);
  ASSERT_TRUE(rogue.ok());
  const absl::Status s =
      (*rogue)->SendLayerFromPool(h_.Header(13, 0), h_.Source());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("not expected on NCCL pair"));
  EXPECT_FALSE(h_.Reported(13));
  auto sender = NcclKvSender::Create(h_.send_pool_.get(), h_.handshake_, 12);
  ASSERT_TRUE(sender.ok());
  for (int64_t l = 0; l < 4; ++l) {
    ASSERT_TRUE(
        (*sender)->SendLayerFromPool(h_.Header(12, l), h_.Source()).ok());
  }
  EXPECT_TRUE((*sender)->Finish().ok());
  auto done = h_.DoneStatus(12, absl::Seconds(10));
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(done->ok()) << *done;
}

TEST_F(NcclKvTransportTest, SenderAbortReachesTheReceiver) {
  h_.StartReceiver();
  ASSERT_TRUE(h_.receiver_->Expect(h_.handshake_, 6).ok());
  auto sender = NcclKvSender::Create(h_.send_pool_.get(), h_.handshake_, 6);
  ASSERT_TRUE(sender.ok());
  ASSERT_TRUE((*sender)->SendLayerFromPool(h_.Header(6, 0), h_.Source()).ok());
  (*sender)->Abort(absl::CancelledError("client went away"));
  auto done = h_.DoneStatus(6, absl::Seconds(10));
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(done->message(), HasSubstr("client went away"));
}

TEST_F(NcclKvTransportTest, ExpectedTransferThatNeverStartsTimesOut) {
  NcclKvReceiverOptions options;
  options.first_frame_timeout = absl::Milliseconds(100);
  h_.StartReceiver(options);
  ASSERT_TRUE(h_.receiver_->Expect(h_.handshake_, 8).ok());
  // The prefill side joins the communicator but never sends.
  auto sender = NcclKvSender::Create(h_.send_pool_.get(), h_.handshake_, 8);
  ASSERT_TRUE(sender.ok());
  auto done = h_.DoneStatus(8, absl::Seconds(10));
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(api_.aborts(), 1);  // the pending receive was withdrawn by abort
}

TEST_F(NcclKvTransportTest, SenderStallTimesOutAndAbortsThePair) {
  h_.StartReceiver();
  ASSERT_TRUE(h_.receiver_->Expect(h_.handshake_, 9).ok());
  NcclKvSenderOptions options;
  options.stall_timeout = absl::Milliseconds(100);
  auto sender =
      NcclKvSender::Create(h_.send_pool_.get(), h_.handshake_, 9, options);
  ASSERT_TRUE(sender.ok());
  // Decode worker dies: its side of the pair is torn down.
  h_.recv_pool_->Abort(h_.handshake_.comm_key,
                       absl::UnavailableError("decode worker died"));
  h_.receiver_.reset();
  // No verdict can come: only the sender's stall_timeout on its wait for it
  // ends the call (the pair is joined, so init_timeout is out of play).
  const absl::Status s =
      (*sender)->SendLayerFromPool(h_.Header(9, 0), h_.Source());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(),
              HasSubstr("KV transfer 9 layer 0 verdict did not complete in "
                        "time; communicator aborted"));
  auto pair = h_.send_pool_->GetOrCreate(h_.handshake_, NcclPairRole::kSender);
  EXPECT_FALSE(pair.ok());  // this generation is gone; a new one is needed
}

TEST_F(NcclKvTransportTest, ShutdownCancelsExpectedTransfers) {
  h_.StartReceiver();
  ASSERT_TRUE(h_.receiver_->Expect(h_.handshake_, 11).ok());
  auto sender = NcclKvSender::Create(h_.send_pool_.get(), h_.handshake_, 11);
  ASSERT_TRUE(sender.ok());
  h_.receiver_.reset();
  auto done = h_.DoneStatus(11, absl::Seconds(1));
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->code(), absl::StatusCode::kCancelled);
}

TEST(NcclControlTest, RoundTripsLayerAndStatusFrames) {
  std::vector<uint8_t> buf(kNcclControlBytes);
  std::span<uint8_t, kNcclControlBytes> out(buf.data(), kNcclControlBytes);
  NcclControl layer;
  layer.frame.kind = KvFrameKind::kLayer;
  layer.frame.header.transfer_id = 42;
  layer.frame.header.request_id = "req-42";
  layer.frame.header.model_id = "smollm";
  layer.frame.header.layout = {30, 3, 64, 16, DType::kF16};
  layer.frame.header.num_tokens = 77;
  layer.frame.header.layer = 29;
  layer.frame.header.payload_bytes = 5 * 12288;
  EncodeNcclControl(layer, out);
  auto got = DecodeNcclControl(out);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->frame.kind, KvFrameKind::kLayer);
  EXPECT_EQ(got->frame.header.transfer_id, 42u);
  EXPECT_EQ(got->frame.header.request_id, "req-42");
  EXPECT_EQ(got->frame.header.model_id, "smollm");
  EXPECT_EQ(got->frame.header.layout, layer.frame.header.layout);
  EXPECT_EQ(got->frame.header.layer, 29);
  EXPECT_EQ(got->frame.header.payload_bytes, 5u * 12288);

  NcclControl status;
  status.frame.kind = KvFrameKind::kStatus;
  status.frame.header.transfer_id = 42;
  status.frame.status_code =
      static_cast<uint32_t>(absl::StatusCode::kInvalidArgument);
  status.message = std::string(10000, 'm');  // cut to kKvMaxMessageBytes
  EncodeNcclControl(status, out);
  got = DecodeNcclControl(out);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->message.size(), kKvMaxMessageBytes);
  EXPECT_EQ(got->frame.status_code, status.frame.status_code);
}

TEST(NcclControlTest, RejectsGarbage) {
  std::vector<uint8_t> buf(kNcclControlBytes, 0xAB);
  auto got = DecodeNcclControl(
      std::span<const uint8_t, kNcclControlBytes>(buf.data(), buf.size()));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
}

// The real NCCL/CUDA path. Needs GPUs; on machines without one it skips and
// the run-time check is scripts/gpu_check.sh's.
TEST(NcclKvTransportGpuTest, RealNcclOnCudaDevices) {
  absl::StatusOr<int> devices = CudaDeviceCount();
  if (!devices.ok() || *devices < 1) {
    GTEST_SKIP() << "no CUDA device: NCCL transport run-time check belongs to "
                    "the GPU check (scripts/gpu_check.sh)"
                 << (devices.ok() ? "" : " [") << devices.status().message()
                 << (devices.ok() ? "" : "]");
  }
  std::unique_ptr<NcclApi> api = CreateCudaNcclApi();
  if (*devices >= 2) {
    NcclKvTransportHarness h(api.get(), 0, 1);
    RunFullTransfer(h);
    return;
  }
  // One device cannot host both ranks (NCCL refuses two ranks per device):
  // check that a join whose peer never arrives is aborted on time.
  NcclCommPoolOptions options;
  options.init_timeout = absl::Seconds(2);
  auto pool = NcclCommPool::Create(api.get(), options);
  ASSERT_TRUE(pool.ok());
  NcclPairHandshake hs;
  hs.comm_key = "prefill-0/decode-0";
  hs.generation = 1;
  auto id = (*pool)->NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  hs.unique_id = *id;
  // The peer rank never joins: only init_timeout ends the join.
  auto pair = (*pool)->GetOrCreate(hs, NcclPairRole::kReceiver);
  EXPECT_EQ(pair.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(
      pair.status().message(),
      HasSubstr(absl::StrCat("peer did not join the communicator within ",
                             absl::FormatDuration(options.init_timeout))));
}

}  // namespace
}  // namespace baton
