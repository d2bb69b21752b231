// Simulated KV transfers (baton-worker --simulate_kv_transfers): layer
// frames without bytes over the real TCP transport, taken only by a
// receiver that accepts them, and paced to the profile's transfer time.
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/engine/simulated_runner.h"
#include "worker/transport/kv_transport_test_util.h"
#include "worker/transport/kv_wire.h"

namespace baton {
namespace {

using namespace ::baton::kvtest;  // NOLINT(build/namespaces): test fixtures

std::unique_ptr<TcpKvReceiver> StartSimulatedReceiver(DecodeSide& decode,
                                                      bool accept) {
  TcpKvReceiverOptions o;
  o.accept_simulated_layers = accept;
  return StartReceiver(decode, o);
}

std::unique_ptr<TcpKvSender> ConnectSimulated(const KvReceiver& r,
                                              uint64_t id) {
  TcpKvSenderOptions o;
  o.simulated_layers = true;
  return Connect(r, id, o);
}

TEST(SimulatedKvTransferTest, LayersLandWithoutABytePerLayer) {
  PrefillSide src(/*num_blocks=*/64, /*num_tokens=*/100, /*seed=*/3);
  DecodeSide decode(/*num_blocks=*/40);
  decode.Expect(7, 100);
  auto receiver = StartSimulatedReceiver(decode, /*accept=*/true);
  auto sender = ConnectSimulated(*receiver, 7);
  for (int64_t l = 0; l < kLayers; ++l) {
    ASSERT_TRUE(SendLayer(*sender, src, 7, l).ok()) << l;
  }
  ASSERT_TRUE(sender->Finish().ok());
  ASSERT_TRUE(decode.WaitDone(7, absl::ZeroDuration()).ok());
  std::vector<int64_t> order(kLayers);
  for (int64_t l = 0; l < kLayers; ++l) order[l] = l;
  EXPECT_EQ(decode.Layers(7), order);
  // Every layer counted as landed, none written.
  for (int64_t l = 0; l < kLayers; ++l) EXPECT_TRUE(decode.Untouched(7, l));
}

TEST(SimulatedKvTransferTest, AReceiverOfRealKvRefusesThem) {
  PrefillSide src(64, 100, 4);
  DecodeSide decode(40);
  decode.Expect(8, 100);
  auto receiver = StartSimulatedReceiver(decode, /*accept=*/false);
  auto sender = ConnectSimulated(*receiver, 8);
  absl::Status s = SendLayer(*sender, src, 8, 0);
  if (s.ok()) s = sender->Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("takes real KV only"));
  EXPECT_EQ(decode.WaitDone(8).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(decode.Untouched(8, 0));
}

TEST(SimulatedKvTransferTest, TheFrameIsCheckedLikeALayerFrame) {
  KvFrame f;
  f.kind = KvFrameKind::kSimulatedLayer;
  f.header.transfer_id = 5;
  f.header.layout = MakeCache(1)->layout();
  f.header.num_tokens = 3 * f.header.layout.block_size;
  f.header.payload_bytes = 3 * kChunkBytes;
  KvFrameBytes b = EncodeKvFrame(f);
  EXPECT_EQ(b[6], 8);  // kind
  auto decoded = DecodeKvFrame(b);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->kind, KvFrameKind::kSimulatedLayer);
  EXPECT_EQ(decoded->header.payload_bytes, 3 * kChunkBytes);
  f.header.first_block = 3;
  EXPECT_THAT(DecodeKvFrame(EncodeKvFrame(f)).status().message(),
              HasSubstr("first_block 3 must be in [0, 3)"));
  b[6] = 9;
  EXPECT_THAT(DecodeKvFrame(b).status().message(),
              HasSubstr("kind 9 must be in [1, 8]"));
}

// The handoff's sink returns from Finish no earlier than the profile's
// transfer time of the tokens it carries (a cached prefix does not
// travel), counted from when it was opened.
TEST(SimulatedKvTransferTest, FinishWaitsForTheProfilesTransferTime) {
  WorkerProfile profile;
  profile.transfer_alpha_s = 0.05;
  profile.kv_bytes_per_token = 1000;
  profile.transfer_bytes_per_s = 1e6;  // 1 ms per token
  auto state = std::make_shared<InMemoryKvSink::State>();
  KvSinkFactory paced = SimulatedTransferSinkFactory(
      [state](const KvSinkInfo&) -> absl::StatusOr<std::unique_ptr<KvSink>> {
        return std::make_unique<InMemoryKvSink>(state);
      },
      profile);
  KvSinkInfo info;
  info.layout = MakeCache(1)->layout();
  info.num_tokens = 10 * info.layout.block_size;  // 160 tokens
  info.first_block = 5;                           // 80 of them travel
  const absl::Time opened = absl::Now();
  auto sink = paced(info);
  ASSERT_TRUE(sink.ok()) << sink.status();
  ASSERT_TRUE((*sink)->Finish().ok());
  EXPECT_GE(absl::Now() - opened, absl::Milliseconds(50 + 80));
  EXPECT_TRUE(state->finished);
}

}  // namespace
}  // namespace baton
