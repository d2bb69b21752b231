// The pieces of the CUDA IPC KV transport below the protocol: the grant
// format, the copy plan, the peer mapping cache, and a sender facing a
// receiver that stalls or lies.
#include <poll.h>
#include <sys/socket.h>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/transport/cuda_ipc_fake_api.h"
#include "worker/transport/cuda_ipc_kv_transport.h"
#include "worker/transport/cuda_ipc_wire.h"
#include "worker/transport/kv_test_peer.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

TEST(CudaIpcWireTest, GrantRoundTrips) {
  CudaIpcGrant g;
  for (size_t i = 0; i < g.handle.size(); ++i) g.handle[i] = 3 * i + 1;
  g.pool_offset = 4096;
  g.pool_bytes = uint64_t{1} << 33;
  g.num_blocks_total = 70000;
  g.block_ids = {69999, 0, 5, 12345};
  const std::vector<uint8_t> bytes = EncodeCudaIpcGrant(g);
  EXPECT_EQ(bytes.size(), kCudaIpcGrantHeaderBytes + 16);
  auto got = DecodeCudaIpcGrant(bytes);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->handle, g.handle);
  EXPECT_EQ(got->pool_offset, g.pool_offset);
  EXPECT_EQ(got->pool_bytes, g.pool_bytes);
  EXPECT_EQ(got->num_blocks_total, g.num_blocks_total);
  EXPECT_EQ(got->block_ids, g.block_ids);
}

TEST(CudaIpcWireTest, RejectsMalformedGrants) {
  CudaIpcGrant g;
  g.pool_bytes = 1024;
  g.num_blocks_total = 4;
  g.block_ids = {0, 3};
  std::vector<uint8_t> bytes = EncodeCudaIpcGrant(g);
  std::vector<uint8_t> bad = bytes;
  bad[0] ^= 1;
  EXPECT_THAT(DecodeCudaIpcGrant(bad).status().message(), HasSubstr("magic"));
  bad = bytes;
  bad.pop_back();
  EXPECT_THAT(DecodeCudaIpcGrant(bad).status().message(),
              HasSubstr("for 2 block ids"));
  bad = bytes;
  bad[kCudaIpcGrantHeaderBytes + 4] = 4;  // second id = 4
  EXPECT_THAT(DecodeCudaIpcGrant(bad).status().message(),
              HasSubstr("block id 4 at index 1 not in [0, 4)"));
  bad = bytes;
  bad[4] = 0xFF, bad[5] = 0xFF, bad[6] = 0xFF;  // 16M ids
  EXPECT_THAT(DecodeCudaIpcGrant(bad).status().message(), HasSubstr("at most"));
  g.num_blocks_total = 0;
  g.block_ids.clear();
  EXPECT_EQ(DecodeCudaIpcGrant(EncodeCudaIpcGrant(g)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeCudaIpcGrant(std::vector<uint8_t>(10)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CudaIpcPlanTest, MergesAdjacentRunsAndSplitsAtBoundaries) {
  std::vector<uint8_t> src(96), dst(320);
  // Destination chunks 0, 1 adjacent, then chunk 5 (chunk_bytes 32).
  uint8_t* const chunks[3] = {&dst[0], &dst[32], &dst[160]};
  const CudaIpcSourceRange whole{src.data(), 96};
  auto copies = PlanCudaIpcCopies({&whole, 1}, chunks, 32);
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0].dst, &dst[0]);
  EXPECT_EQ(copies[0].src, &src[0]);
  EXPECT_EQ(copies[0].bytes, 64u);
  EXPECT_EQ(copies[1].dst, &dst[160]);
  EXPECT_EQ(copies[1].src, &src[64]);
  EXPECT_EQ(copies[1].bytes, 32u);
  // Source pieces of 50, 14 (adjacent in memory) and 32 (elsewhere).
  std::vector<uint8_t> other(32);
  const CudaIpcSourceRange pieces[3] = {
      {&src[0], 50}, {&src[50], 14}, {other.data(), 32}};
  copies = PlanCudaIpcCopies(pieces, chunks, 32);
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0].bytes, 64u);
  EXPECT_EQ(copies[1].src, other.data());
  EXPECT_EQ(copies[1].dst, &dst[160]);
  // Destinations out of order: a copy per destination chunk; the two source
  // pieces feeding chunk 1 are adjacent on both sides and merge.
  uint8_t* const scattered[3] = {&dst[64], &dst[0], &dst[256]};
  copies = PlanCudaIpcCopies(pieces, scattered, 32);
  ASSERT_EQ(copies.size(), 3u);
  EXPECT_EQ(copies[0].dst, &dst[64]);
  EXPECT_EQ(copies[0].bytes, 32u);
  EXPECT_EQ(copies[1].dst, &dst[0]);
  EXPECT_EQ(copies[1].src, &src[32]);
  EXPECT_EQ(copies[1].bytes, 32u);
  EXPECT_EQ(copies[2].dst, &dst[256]);
  EXPECT_EQ(copies[2].src, other.data());
  // A piece split across two chunks of 36 bytes: 40 source bytes, then 32,
  // at dst 0 and dst 256.
  const CudaIpcSourceRange uneven[2] = {{&src[0], 40}, {other.data(), 32}};
  uint8_t* const two[2] = {&dst[0], &dst[256]};
  copies = PlanCudaIpcCopies(uneven, two, 36);
  ASSERT_EQ(copies.size(), 3u);  // 36 | 4 + 32 (split by source)
  EXPECT_EQ(copies[0].bytes, 36u);
  EXPECT_EQ(copies[1].dst, &dst[256]);
  EXPECT_EQ(copies[1].bytes, 4u);
  EXPECT_EQ(copies[2].dst, &dst[260]);
  EXPECT_EQ(copies[2].bytes, 32u);
}

class CudaIpcPeerMappingsTest : public ::testing::Test {
 protected:
  CudaIpcPeerMappingsTest() {
    api_.RegisterAllocation(0, a_.data(), a_.size());
    api_.RegisterAllocation(0, b_.data(), b_.size());
    ha_ = api_.ExportMemory(0, a_.data() + 8)->handle;
    hb_ = api_.ExportMemory(0, b_.data())->handle;
    mappings_ = *CudaIpcPeerMappings::Create(&api_, 0);
  }
  FakeCudaIpcApi api_;
  std::vector<uint8_t> a_ = std::vector<uint8_t>(64), b_ = a_;
  CudaIpcHandleBytes ha_, hb_;
  std::unique_ptr<CudaIpcPeerMappings> mappings_;
};

TEST_F(CudaIpcPeerMappingsTest, OpensEachHandleOnce) {
  auto m1 = mappings_->Open(ha_, "peer-a");
  auto m2 = mappings_->Open(ha_, "peer-a");
  ASSERT_TRUE(m1.ok() && m2.ok());
  EXPECT_EQ(*m1, *m2);
  EXPECT_EQ((*m1)->base(), a_.data());
  EXPECT_EQ(api_.num_opens(), 1);
  EXPECT_EQ(mappings_->num_cached(), 1);
  EXPECT_EQ(CudaIpcPeerMappings::Create(nullptr, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaIpcPeerMappingsTest, EvictedMappingClosesAfterItsLastUser) {
  auto user = *mappings_->Open(ha_, "peer-a");
  ASSERT_TRUE(mappings_->Open(hb_, "peer-b").ok());
  mappings_->EvictPeer("peer-a");
  EXPECT_EQ(mappings_->num_cached(), 1);
  EXPECT_EQ(api_.num_closes(), 0);
  // Still open in this process: a new Open reuses it instead of failing.
  auto again = mappings_->Open(ha_, "peer-a");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, user);
  EXPECT_EQ(api_.num_opens(), 2);
  mappings_->Evict(ha_);
  again->reset();
  EXPECT_EQ(api_.num_closes(), 0);
  user.reset();
  EXPECT_EQ(api_.num_closes(), 1);
  // Closed: the next Open opens anew.
  ASSERT_TRUE(mappings_->Open(ha_, "peer-a").ok());
  EXPECT_EQ(api_.num_opens(), 3);
  mappings_.reset();
  EXPECT_EQ(api_.num_open(), 0);
}

TEST_F(CudaIpcPeerMappingsTest, OpenErrorIsReturnedAndNotCached) {
  api_.FailNextOpen(absl::InternalError("cudaErrorMapFailed"));
  EXPECT_THAT(mappings_->Open(ha_, "p").status().message(),
              HasSubstr("cudaErrorMapFailed"));
  EXPECT_EQ(mappings_->num_cached(), 0);
  EXPECT_TRUE(mappings_->Open(ha_, "p").ok());
}

// A receiver that accepts one connection, reads one layer frame and answers
// with `grant` (or, without one, never answers).
class ScriptedReceiver {
 public:
  explicit ScriptedReceiver(std::optional<CudaIpcGrant> grant)
      : grant_(std::move(grant)) {
    listen_ = *TcpListen("127.0.0.1", 0, &port_);
    thread_ = std::thread([this] { Run(); });
  }
  ~ScriptedReceiver() {
    stop_ = true;
    thread_.join();
  }
  std::string endpoint() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  void Run() {
    pollfd p{listen_.get(), POLLIN, 0};
    while (!stop_ && poll(&p, 1, 10) <= 0) {
    }
    if (stop_) return;
    UniqueFd fd(accept4(listen_.get(), nullptr, nullptr, SOCK_NONBLOCK));
    SocketIoOptions io;
    io.stall_timeout = absl::Seconds(5);
    if (!kvtest::AnswerHello(fd.get(), io).ok()) return;
    KvFrameBytes bytes;
    if (!RecvExact(fd.get(), bytes, io, "frame").ok()) return;
    const KvFrame f = *DecodeKvFrame(bytes);
    std::vector<uint8_t> ids(f.request_id_bytes + f.model_id_bytes);
    if (!RecvExact(fd.get(), ids, io, "ids").ok()) return;
    if (grant_.has_value()) {
      EXPECT_TRUE(SendCudaIpcVerdict(fd.get(), f.header.transfer_id,
                                     absl::OkStatus(), grant_, io)
                      .ok());
    }
    while (!stop_) absl::SleepFor(absl::Milliseconds(5));
  }

  std::optional<CudaIpcGrant> grant_;
  UniqueFd listen_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class CudaIpcSenderVsBadReceiverTest : public CudaIpcPeerMappingsTest {
 protected:
  KvTransferHeader Header() const {
    KvTransferHeader h;
    h.transfer_id = 1;
    h.request_id = "r";
    h.layout = {4, 2, 8, 4, DType::kF16};  // chunk_bytes 256
    h.num_tokens = 10;                     // 3 blocks
    h.layer = 1;
    h.payload_bytes = 3 * 256;
    return h;
  }
  absl::Status SendOneLayer(const std::string& endpoint,
                            absl::Duration stall = absl::Seconds(5)) {
    CudaIpcKvSenderOptions options;
    options.stall_timeout = stall;
    auto sender =
        CudaIpcKvSender::Connect(mappings_.get(), endpoint, 1, options);
    if (!sender.ok()) return sender.status();
    return (*sender)->SendLayer(Header(), payload_);
  }
  std::vector<uint8_t> payload_ = std::vector<uint8_t>(3 * 256, 0x42);
};

TEST_F(CudaIpcSenderVsBadReceiverTest, SilentReceiverTimesOut) {
  // The receiver never answers nor closes: only the sender's stall_timeout
  // on the verdict can end the call.
  ScriptedReceiver receiver(std::nullopt);
  const absl::Duration kStall = absl::Milliseconds(100);
  const absl::Status s = SendOneLayer(receiver.endpoint(), kStall);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(
                               "no progress for ", absl::FormatDuration(kStall),
                               " while reading the KV receiver's verdict")));
}

TEST_F(CudaIpcSenderVsBadReceiverTest, GrantThatDoesNotFitIsRefused) {
  CudaIpcGrant g;
  g.handle = ha_;
  g.num_blocks_total = 2;
  g.pool_bytes = 4 * 2 * 256 + 256;  // one chunk more than 4 layers hold
  g.block_ids = {0, 1, 1};
  ScriptedReceiver receiver(g);
  const absl::Status s = SendOneLayer(receiver.endpoint());
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_THAT(s.message(), HasSubstr("does not hold 4 layers"));
  EXPECT_EQ(api_.num_opens(), 0);
  EXPECT_EQ(api_.num_copies(), 0);
}

TEST_F(CudaIpcSenderVsBadReceiverTest, GrantWithTooFewBlocksIsRefused) {
  CudaIpcGrant g;
  g.handle = ha_;
  g.num_blocks_total = 2;
  g.pool_bytes = 4 * 2 * 256;
  g.block_ids = {0, 1};
  ScriptedReceiver receiver(g);
  const absl::Status s = SendOneLayer(receiver.endpoint());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("granted 2 blocks, 3 needed"));
  EXPECT_EQ(api_.num_copies(), 0);
}

}  // namespace
}  // namespace baton
