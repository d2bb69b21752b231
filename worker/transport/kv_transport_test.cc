// Host (TCP) KV transport on loopback: full transfers between two pools,
// unknown transfers, concurrency and throughput.
#include "worker/transport/kv_transport_test_util.h"

namespace baton {
namespace {

using namespace ::baton::kvtest;  // NOLINT(build/namespaces): test fixtures

TEST(TcpKvTransportTest, MovesEveryLayerInOrderBitExact) {
  PrefillSide src(/*num_blocks=*/64, /*num_tokens=*/100, /*seed=*/1);
  DecodeSide decode(/*num_blocks=*/40);
  decode.Expect(7, 100);
  auto receiver = StartReceiver(decode);
  auto sender = Connect(*receiver, 7);
  for (int64_t l = 0; l < kLayers; ++l) {
    ASSERT_TRUE(SendLayer(*sender, src, 7, l).ok());
  }
  ASSERT_TRUE(sender->Finish().ok());
  // Finish returns after on_done.
  EXPECT_TRUE(decode.WaitDone(7, absl::ZeroDuration()).ok());
  std::vector<int64_t> expected_order(kLayers);
  for (int64_t l = 0; l < kLayers; ++l) expected_order[l] = l;
  EXPECT_EQ(decode.Layers(7), expected_order);
  for (int64_t l = 0; l < kLayers; ++l) decode.ExpectSameKv(7, src, l);
}

TEST(TcpKvTransportTest, UnknownTransferIdIsNotFound) {
  PrefillSide src(64, 20, 3);
  DecodeSide decode(40);
  auto receiver = StartReceiver(decode);
  auto sender = Connect(*receiver, 1234);
  absl::Status s = SendLayer(*sender, src, 1234, 0);
  if (s.ok()) s = sender->Finish();
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_TRUE(absl::IsNotFound(decode.WaitDone(1234)));
}

// A raw client that sends layer 0 in full, then `extra` bytes of layer 1,
// then closes: the receiver reports Unavailable.
TEST(TcpKvTransportTest, FourConcurrentSenders) {
  constexpr int kSenders = 4;
  std::vector<std::unique_ptr<PrefillSide>> srcs;
  DecodeSide decode(60);
  for (int i = 0; i < kSenders; ++i) {
    srcs.push_back(std::make_unique<PrefillSide>(16 + i, 100 + 37 * i, 20 + i));
    decode.Expect(100 + i, 100 + 37 * i);
  }
  auto receiver = StartReceiver(decode);
  std::vector<absl::Status> results(kSenders);
  std::vector<std::thread> threads;
  for (int i = 0; i < kSenders; ++i) {
    threads.emplace_back([&, i] {
      auto sender = Connect(*receiver, 100 + i);
      absl::Status s;
      for (int64_t l = 0; l < kLayers && s.ok(); ++l) {
        s = SendLayer(*sender, *srcs[i], 100 + i, l);
      }
      results[i] = s.ok() ? sender->Finish() : s;
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kSenders; ++i) {
    EXPECT_TRUE(results[i].ok()) << results[i];
    EXPECT_TRUE(decode.WaitDone(100 + i).ok());
    for (int64_t l = 0; l < kLayers; ++l) {
      decode.ExpectSameKv(100 + i, *srcs[i], l);
    }
  }
}

TEST(TcpKvTransportTest, PrintsLoopbackThroughput) {
  constexpr int64_t kTokens = 1024;
  PrefillSide src(kTokens / 16, kTokens, 9);
  DecodeSide decode(kTokens / 16 + 3);
  std::vector<std::vector<uint8_t>> layers;
  uint64_t total = 0;
  for (int64_t l = 0; l < kLayers; ++l) {
    layers.push_back(src.Export(l));
    total += layers.back().size();
  }
  auto receiver = StartReceiver(decode);
  double best_transfer = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    decode.FreeAll();
    decode.Expect(200 + rep, kTokens);
    auto sender = Connect(*receiver, 200 + rep);
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t l = 0; l < kLayers; ++l) {
      KvTransferHeader h = src.Header(200 + rep, l);
      h.checksum = KvChecksum(layers[l]);
      ASSERT_TRUE(sender->SendLayer(h, layers[l]).ok());
    }
    ASSERT_TRUE(sender->Finish().ok());
    best_transfer = std::min(
        best_transfer,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count());
  }
  std::vector<uint8_t> dst(total);
  double best_copy = 1e9;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t off = 0;
    for (const auto& layer : layers) {
      std::memcpy(dst.data() + off, layer.data(), layer.size());
      off += layer.size();
    }
    best_copy = std::min(best_copy, std::chrono::duration<double>(
                                        std::chrono::steady_clock::now() - t0)
                                        .count());
  }
  EXPECT_EQ(std::memcmp(dst.data(), layers[0].data(), layers[0].size()), 0);
  std::printf(
      "[ throughput ] %lld tokens x %lld layers = %.1f MiB: TCP loopback "
      "transfer (checksum+send+recv+verify+import) %.2f GB/s (%.2f ms), "
      "memcpy %.2f GB/s\n",
      static_cast<long long>(kTokens), static_cast<long long>(kLayers),
      total / 1048576.0, total / best_transfer / 1e9, best_transfer * 1e3,
      total / best_copy / 1e9);
}

}  // namespace
}  // namespace baton
