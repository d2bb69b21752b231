// Host (TCP) KV transport on loopback under faults: per-field rejections
// before any write (a bad checksum after the in-place write, never
// committed), disconnects, stalls, aborts, receiver shutdown, and a sender
// whose source memory is revoked.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "worker/transport/kv_handshake.h"
#include "worker/transport/kv_test_peer.h"
#include "worker/transport/kv_transport_test_util.h"
#include "worker/transport/tcp_kv_internal.h"

namespace baton {
namespace {

using namespace ::baton::kvtest;  // NOLINT(build/namespaces): test fixtures

struct Corruption {
  const char* name;
  void (*apply)(KvTransferHeader&, std::vector<uint8_t>&);
  absl::StatusCode code;
  const char* message;
  // The header is valid, so the payload lands in the reserved blocks before
  // its checksum fails (never committed: on_layer / on_done OK never come).
  bool payload_lands = false;
};

class RejectionTest : public ::testing::TestWithParam<Corruption> {};

TEST_P(RejectionTest, RejectsLayerBeforeWritingAndStops) {
  constexpr int64_t kBad = 5;
  PrefillSide src(64, 100, 2);
  DecodeSide decode(40);
  decode.Expect(9, 100);
  auto receiver = StartReceiver(decode);
  auto sender = Connect(*receiver, 9);
  absl::Status s;
  for (int64_t l = 0; l < kLayers && s.ok(); ++l) {
    KvTransferHeader h = src.Header(9, l);
    std::vector<uint8_t> bytes = src.Export(l);
    h.checksum = KvChecksum(bytes, kChunkBytes);
    if (l == kBad) GetParam().apply(h, bytes);
    s = sender->SendLayer(h, bytes);
  }
  if (s.ok()) s = sender->Finish();
  EXPECT_EQ(s.code(), GetParam().code) << s;
  EXPECT_THAT(s.message(), HasSubstr(GetParam().message));
  absl::Status done = decode.WaitDone(9);
  EXPECT_EQ(done.code(), GetParam().code) << done;
  EXPECT_THAT(done.message(), HasSubstr(GetParam().message));
  for (int64_t l = 0; l < kBad; ++l) decode.ExpectSameKv(9, src, l);
  EXPECT_EQ(decode.Untouched(9, kBad), !GetParam().payload_lands);
  for (int64_t l = kBad + 1; l < kLayers; ++l) {
    EXPECT_TRUE(decode.Untouched(9, l)) << "layer " << l << " written";
  }
  EXPECT_EQ(decode.Layers(9).size(), static_cast<size_t>(kBad));
  decode.FreeAll();  // free == total checked inside
}

INSTANTIATE_TEST_SUITE_P(
    Fields, RejectionTest,
    ::testing::Values(
        Corruption{"layout",
                   [](KvTransferHeader& h, std::vector<uint8_t>&) {
                     h.layout.head_dim = 32;
                   },
                   absl::StatusCode::kInvalidArgument, "head_dim 32"},
        Corruption{"num_tokens",
                   [](KvTransferHeader& h, std::vector<uint8_t>&) {
                     h.num_tokens = 99;
                   },
                   absl::StatusCode::kInvalidArgument,
                   "num_tokens 99 vs expected 100"},
        Corruption{"checksum",
                   [](KvTransferHeader&, std::vector<uint8_t>& b) {
                     b[b.size() / 2] ^= 1;
                   },
                   absl::StatusCode::kDataLoss, "checksum mismatch",
                   /*payload_lands=*/true},
        Corruption{"truncated",
                   [](KvTransferHeader& h, std::vector<uint8_t>& b) {
                     b.resize(b.size() - 1000);
                     h.payload_bytes = b.size();
                     h.checksum = KvChecksum(b, kChunkBytes);
                   },
                   absl::StatusCode::kInvalidArgument, "payload_bytes"},
        Corruption{"model",
                   [](KvTransferHeader& h, std::vector<uint8_t>&) {
                     h.model_id = "llama-3-8b";
                   },
                   absl::StatusCode::kInvalidArgument, "model_id"},
        Corruption{"request",
                   [](KvTransferHeader& h, std::vector<uint8_t>&) {
                     h.request_id = "someone-else";
                   },
                   absl::StatusCode::kInvalidArgument, "request_id"}),
    [](const auto& info) { return std::string(info.param.name); });

void DisconnectAfter(uint64_t extra_bytes_of_layer1) {
  PrefillSide src(64, 100, 4);
  DecodeSide decode(40);
  decode.Expect(11, 100);
  auto receiver = StartReceiver(decode);
  {
    auto fd = TcpConnect(receiver->endpoint(), absl::Seconds(5));
    ASSERT_TRUE(fd.ok()) << fd.status();
    SocketIoOptions io;
    ASSERT_TRUE(ProveInvited(fd->get(), 11, "", io).ok());
    for (int64_t l = 0; l < 2; ++l) {
      KvFrame f;
      f.header = src.Header(11, l);
      std::vector<uint8_t> bytes = src.Export(l);
      KvFrameBytes head = EncodeKvFrame(f);
      std::string ids = f.header.request_id + f.header.model_id;
      KvTrailerBytes trailer = EncodeKvTrailer(KvChecksum(bytes, kChunkBytes));
      // Layer 0 whole with its trailer; layer 1 cut inside its payload.
      const size_t n = l == 0 ? bytes.size() : extra_bytes_of_layer1;
      iovec iov[4] = {{head.data(), head.size()},
                      {ids.data(), ids.size()},
                      {bytes.data(), n},
                      {trailer.data(), l == 0 ? trailer.size() : 0}};
      ASSERT_TRUE(SendAllV(fd->get(), iov, 4, io, "test").ok());
    }
  }  // closes the socket
  absl::Status done = decode.WaitDone(11);
  EXPECT_TRUE(absl::IsUnavailable(done)) << done;
  EXPECT_THAT(done.message(), HasSubstr("after 1 of 30 layers"));
  // Bytes of a cut layer may have landed (reserved, never committed).
  EXPECT_EQ(decode.Untouched(11, 1), extra_bytes_of_layer1 == 0);
  EXPECT_TRUE(decode.Untouched(11, 2));
  EXPECT_EQ(decode.Layers(11).size(), 1u);
  decode.FreeAll();  // free == total checked inside
}

TEST(TcpKvTransportTest, SenderDisconnectMidLayerIsUnavailable) {
  DisconnectAfter(5000);
}

TEST(TcpKvTransportTest, SenderDisconnectBetweenLayersIsUnavailable) {
  DisconnectAfter(0);
}

TEST(TcpKvTransportTest, StalledSenderTimesOutOnBothSides) {
  const absl::Duration kStall = absl::Milliseconds(300);
  PrefillSide src(64, 100, 5);
  DecodeSide decode(40);
  decode.Expect(12, 100);
  auto receiver = StartReceiver(decode, kStall);
  auto sender = Connect(*receiver, 12);
  ASSERT_TRUE(SendLayer(*sender, src, 12, 0).ok());
  ASSERT_TRUE(SendLayer(*sender, src, 12, 1).ok());
  // The receiver's stall_timeout, while it waits for the next frame, is the
  // only timeout that can end the transfer (the sender's is 10s and it waits
  // for nothing here).
  const std::string stalled =
      absl::StrCat("no progress for ", absl::FormatDuration(kStall),
                   " while waiting for the next frame");
  absl::Status done = decode.WaitDone(12);
  EXPECT_TRUE(absl::IsDeadlineExceeded(done)) << done;
  EXPECT_THAT(done.message(), HasSubstr(stalled));
  // The sender learns it once the receiver's status frame has reached it:
  // on its next call, or at the latest in Finish (on_done runs before the
  // receiver writes that frame, so the next layer may still be buffered).
  absl::Status s = SendLayer(*sender, src, 12, 2);
  if (s.ok()) s = sender->Finish();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(stalled));
  EXPECT_TRUE(decode.Untouched(12, 2));
}

TEST(TcpKvTransportTest, SilentReceiverTimesOutSender) {
  int port = 0;
  auto listener = TcpListen("127.0.0.1", 0, &port);
  ASSERT_TRUE(listener.ok());
  const absl::Duration kStall = absl::Milliseconds(300);
  // Nobody accepts or reads: the connection opens (the kernel's backlog),
  // and the sender stalls waiting for the challenge to its hello. Its
  // stall_timeout is the only timeout in play.
  auto sender = TcpKvSender::Connect("127.0.0.1:" + std::to_string(port), 1,
                                     {.stall_timeout = kStall});
  const absl::Status s = sender.status();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrCat("no progress for ",
                                     absl::FormatDuration(kStall))));
}

TEST(TcpKvTransportTest, AbortReportsSenderReason) {
  PrefillSide src(64, 30, 7);
  DecodeSide decode(40);
  decode.Expect(13, 30);
  auto receiver = StartReceiver(decode);
  auto sender = Connect(*receiver, 13);
  ASSERT_TRUE(SendLayer(*sender, src, 13, 0).ok());
  sender->Abort(absl::InternalError("prefill worker failed"));
  absl::Status done = decode.WaitDone(13);
  EXPECT_TRUE(absl::IsInternal(done)) << done;
  EXPECT_THAT(done.message(), HasSubstr("prefill worker failed"));
  EXPECT_FALSE(sender->Finish().ok());
}

TEST(TcpKvTransportTest, ReceiverShutdownCancelsInFlightTransfer) {
  PrefillSide src(64, 30, 8);
  DecodeSide decode(40);
  decode.Expect(14, 30);
  auto receiver = StartReceiver(decode, absl::Seconds(30));
  auto sender = Connect(*receiver, 14);
  ASSERT_TRUE(SendLayer(*sender, src, 14, 0).ok());
  // Wait until the receiver is mid-transfer (layer 0 imported).
  for (int i = 0; i < 6000 && decode.Layers(14).empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(decode.Layers(14).size(), 1u);
  // Shutdown joins the connection's thread, so on_done has come by the time
  // reset() returns. Without the cancel, the wait for layer 1's frame would
  // end only at the 30s stall_timeout, with DeadlineExceeded.
  receiver.reset();
  absl::Status done = decode.WaitDone(14, absl::ZeroDuration());
  EXPECT_TRUE(absl::IsCancelled(done)) << done;
  EXPECT_THAT(done.message(), HasSubstr("cancelled (shutting down) while "
                                        "waiting for the next frame"));
}

// Refuses Enter() from the `revoke_at`-th call on (0-based).
class CountingGate : public KvReadGate {
 public:
  explicit CountingGate(int revoke_at) : revoke_at_(revoke_at) {}
  bool Enter() override {
    EXPECT_FALSE(inside_);
    if (enters_++ >= revoke_at_) return false;
    inside_ = true;
    return true;
  }
  void Exit() override {
    EXPECT_TRUE(inside_);
    inside_ = false;
  }
  int enters() const { return enters_; }
  bool inside() const { return inside_; }

 private:
  int revoke_at_;
  int enters_ = 0;
  bool inside_ = false;
};

TEST(TcpKvTransportTest, RevokedGateBeforeLayerFailsWithoutWriting) {
  PrefillSide src(64, 100, 15);
  DecodeSide decode(40);
  decode.Expect(15, 100);
  auto receiver = StartReceiver(decode);
  auto sender = Connect(*receiver, 15);
  ASSERT_TRUE(SendLayer(*sender, src, 15, 0).ok());
  KvTransferHeader h = src.Header(15, 1);  // checksum 0: hashed under the gate
  auto chunks = src.cache->LayerChunks(src.table, 1, 100);
  ASSERT_TRUE(chunks.ok());
  CountingGate gate(/*revoke_at=*/0);
  absl::Status s = sender->SendLayerChunks(h, *chunks, &gate);
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("source memory released"));
  EXPECT_EQ(gate.enters(), 1);
  EXPECT_FALSE(gate.inside());
  // The connection is closed: the receiver sees the sender go away.
  absl::Status done = decode.WaitDone(15);
  EXPECT_TRUE(absl::IsUnavailable(done)) << done;
  EXPECT_TRUE(decode.Untouched(15, 1));
  EXPECT_EQ(sender->Finish().code(), absl::StatusCode::kCancelled);
  decode.FreeAll();
}

// A reader that drains slowly, so the 8 MiB payload takes many sendmsg
// calls; the second one finds the gate revoked. `checksum` 0: the sender
// hashes the chunks as it sends (sendmsg calls of send_call_bytes).
void RevokeMidLayer(uint64_t checksum) {
  int port = 0;
  auto listener = TcpListen("127.0.0.1", 0, &port);
  ASSERT_TRUE(listener.ok());
  std::atomic<uint64_t> drained{0};
  std::thread reader([&] {
    SocketIoOptions io;
    ASSERT_TRUE(WaitFd(listener->get(), POLLIN, io, "accept").ok());
    UniqueFd fd(accept4(listener->get(), nullptr, nullptr, SOCK_NONBLOCK));
    ASSERT_GE(fd.get(), 0);
    ASSERT_TRUE(AnswerHello(fd.get(), io).ok());
    std::vector<uint8_t> buf(64 << 10);
    while (WaitFd(fd.get(), POLLIN, io, "drain").ok()) {
      const ssize_t n = recv(fd.get(), buf.data(), buf.size(), 0);
      if (n == 0 || (n < 0 && errno != EAGAIN)) return;
      if (n > 0) drained += static_cast<uint64_t>(n);
      absl::SleepFor(absl::Microseconds(200));
    }
  });
  auto sender = TcpKvSender::Connect("127.0.0.1:" + std::to_string(port), 16);
  ASSERT_TRUE(sender.ok()) << sender.status();
  std::vector<uint8_t> payload(8 << 20, 0x33);
  std::vector<std::span<const uint8_t>> chunks;
  for (size_t off = 0; off < payload.size(); off += kChunkBytes) {
    chunks.emplace_back(payload.data() + off,
                        std::min<size_t>(kChunkBytes, payload.size() - off));
  }
  KvTransferHeader h;
  h.transfer_id = 16;
  h.layout = MakeCache(1)->layout();
  h.payload_bytes = payload.size();
  h.checksum = checksum;
  CountingGate gate(/*revoke_at=*/1);
  absl::Status s = (*sender)->SendLayerChunks(h, chunks, &gate);
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  EXPECT_EQ(gate.enters(), 2);
  EXPECT_FALSE(gate.inside());
  reader.join();  // ends at EOF: the sender closed mid-frame
  EXPECT_GT(drained.load(), 0u);
  EXPECT_LT(drained.load(), kKvFrameHeaderBytes + payload.size());
}

TEST(TcpKvTransportTest, RevokedGateMidLayerClosesTheConnection) {
  std::vector<uint8_t> payload(8 << 20, 0x33);
  RevokeMidLayer(KvChecksum(payload, kChunkBytes));
}

TEST(TcpKvTransportTest, RevokedGateMidLayerClosesTheConnectionHashing) {
  RevokeMidLayer(0);
}

}  // namespace
}  // namespace baton
