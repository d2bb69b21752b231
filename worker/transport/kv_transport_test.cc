// Host (TCP) KV transport on loopback: full transfers between two pools,
// per-field rejections before any write, disconnects, stalls, concurrency.
#include "worker/transport/kv_transport.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/kv_cache/kv_cache.h"
#include "worker/transport/kv_wire.h"
#include "worker/transport/socket_io.h"
#include "worker/transport/tcp_kv_transport.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kLayers = 30;
constexpr uint8_t kSentinel = 0x5A;

std::unique_ptr<KvCache> MakeCache(int64_t num_blocks) {
  KvCacheOptions o;
  o.num_layers = kLayers;
  o.num_kv_heads = 3;
  o.head_dim = 64;
  o.block_size = 16;
  o.num_blocks = num_blocks;
  auto cache = KvCache::Create(o);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return std::move(cache).value();
}

// The prefill side: a sequence of num_tokens random tokens in every layer.
struct PrefillSide {
  PrefillSide(int64_t num_blocks, int64_t num_tokens, uint32_t seed)
      : cache(MakeCache(num_blocks)) {
    EXPECT_TRUE(cache->Reserve(table, num_tokens).ok());
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    const int64_t kv_dim = cache->layout().kv_dim();
    std::vector<float> k(static_cast<size_t>(num_tokens * kv_dim));
    std::vector<float> v(k.size());
    for (int64_t l = 0; l < kLayers; ++l) {
      for (float& x : k) x = normal(rng);
      for (float& x : v) x = normal(rng);
      cache->WriteKvRange(table, l, 0, num_tokens, k.data(), v.data());
    }
    EXPECT_TRUE(cache->SetNumTokens(table, num_tokens).ok());
  }
  ~PrefillSide() { cache->Free(table); }

  KvTransferHeader Header(uint64_t id, int64_t layer) const {
    KvTransferHeader h;
    h.transfer_id = id;
    h.request_id = "req-" + std::to_string(id);
    h.model_id = "smollm2-135m";
    h.layout = cache->layout();
    h.num_tokens = table.num_tokens();
    h.layer = layer;
    h.payload_bytes = cache->LayerBytes(table);
    return h;
  }
  std::vector<uint8_t> Export(int64_t layer) const {
    std::vector<uint8_t> out(cache->LayerBytes(table));
    EXPECT_TRUE(cache->ExportLayer(table, layer, out).ok());
    return out;
  }

  std::unique_ptr<KvCache> cache;
  BlockTable table;
};

// The decode side: reserved tables by transfer id, and what the receiver
// reported.
class DecodeSide {
 public:
  explicit DecodeSide(int64_t num_blocks) : cache_(MakeCache(num_blocks)) {
    // Shift block ids so they differ from the sender's.
    EXPECT_TRUE(cache_->Reserve(pad_, 3 * cache_->block_size()).ok());
  }
  ~DecodeSide() { FreeAll(); }

  KvCache* cache() { return cache_.get(); }

  // Reserves num_tokens and fills every layer of the blocks with kSentinel.
  void Expect(uint64_t id, int64_t num_tokens) {
    absl::MutexLock lock(&mu_);
    BlockTable& t = tables_[id];
    ASSERT_TRUE(cache_->Reserve(t, num_tokens).ok());
    std::vector<uint8_t> fill(cache_->LayerBytesForTokens(num_tokens),
                              kSentinel);
    for (int64_t l = 0; l < kLayers; ++l) {
      ASSERT_TRUE(cache_->ImportLayer(t, l, num_tokens, fill).ok());
    }
    tokens_[id] = num_tokens;
  }

  KvReceiverCallbacks Callbacks() {
    KvReceiverCallbacks cb;
    cb.lookup = [this](uint64_t id) -> absl::StatusOr<KvTransferTarget> {
      absl::MutexLock lock(&mu_);
      auto it = tables_.find(id);
      if (it == tables_.end()) {
        return absl::NotFoundError("no reservation for transfer " +
                                   std::to_string(id));
      }
      KvTransferTarget t;
      t.cache = cache_.get();
      t.table = &it->second;
      t.expected_layout = cache_->layout();
      t.num_tokens = tokens_[id];
      t.expected_model_id = "smollm2-135m";
      t.cache_mutex = &cache_mu_;
      return t;
    };
    cb.on_layer = [this](uint64_t id, int64_t layer) {
      absl::MutexLock lock(&mu_);
      layers_[id].push_back(layer);
    };
    cb.on_done = [this](uint64_t id, absl::Status s) {
      absl::MutexLock lock(&mu_);
      EXPECT_EQ(done_.count(id), 0u) << "on_done twice for " << id;
      done_[id] = s;
    };
    return cb;
  }

  // The transfer's final status; DeadlineExceeded (test failure) if on_done
  // does not come within `wait`.
  absl::Status WaitDone(uint64_t id, absl::Duration wait = absl::Seconds(10)) {
    absl::MutexLock lock(&mu_);
    auto ready = [&] { return done_.count(id) > 0; };
    mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
    if (!ready()) {
      ADD_FAILURE() << "no on_done for transfer " << id;
      return absl::DeadlineExceededError("test wait");
    }
    return done_[id];
  }

  std::vector<int64_t> Layers(uint64_t id) {
    absl::MutexLock lock(&mu_);
    return layers_[id];
  }

  // True if every byte of (layer) in the transfer's blocks is kSentinel.
  bool Untouched(uint64_t id, int64_t layer) {
    absl::MutexLock lock(&mu_);
    const BlockTable& t = tables_[id];
    for (int32_t b : t.block_ids()) {
      const uint8_t* p = cache_->LayerBlock(layer, b);
      for (uint64_t i = 0; i < cache_->chunk_bytes(); ++i) {
        if (p[i] != kSentinel) return false;
      }
    }
    return true;
  }

  // Every token of `layer` reads back as in the sender's pool.
  void ExpectSameKv(uint64_t id, const PrefillSide& src, int64_t layer) {
    absl::MutexLock lock(&mu_);
    const BlockTable& t = tables_[id];
    const size_t dim = static_cast<size_t>(cache_->layout().kv_dim());
    std::vector<float> k0(dim), v0(dim), k1(dim), v1(dim);
    for (int64_t pos = 0; pos < src.table.num_tokens(); ++pos) {
      src.cache->ReadKv(src.table, layer, pos, k0.data(), v0.data());
      cache_->ReadKv(t, layer, pos, k1.data(), v1.data());
      ASSERT_EQ(std::memcmp(k0.data(), k1.data(), dim * 4), 0)
          << "K layer " << layer << " pos " << pos;
      ASSERT_EQ(std::memcmp(v0.data(), v1.data(), dim * 4), 0)
          << "V layer " << layer << " pos " << pos;
    }
  }

  void FreeAll() {
    absl::MutexLock lock(&mu_);
    absl::MutexLock cache_lock(&cache_mu_);
    for (auto& [id, t] : tables_) cache_->Free(t);
    tables_.clear();
    cache_->Free(pad_);
    EXPECT_EQ(cache_->num_blocks_free(), cache_->num_blocks_total());
    EXPECT_TRUE(cache_->CheckInvariants().ok());
  }

 private:
  std::unique_ptr<KvCache> cache_;
  absl::Mutex cache_mu_;
  BlockTable pad_;
  absl::Mutex mu_;
  std::map<uint64_t, BlockTable> tables_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, int64_t> tokens_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::vector<int64_t>> layers_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, absl::Status> done_ ABSL_GUARDED_BY(mu_);
};

std::unique_ptr<TcpKvReceiver> StartReceiver(
    DecodeSide& decode, absl::Duration stall = absl::Seconds(10)) {
  TcpKvReceiverOptions o;
  o.stall_timeout = stall;
  auto r = TcpKvReceiver::Start(o, decode.Callbacks());
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_GT((*r)->port(), 0);
  return std::move(r).value();
}

std::unique_ptr<TcpKvSender> Connect(const KvReceiver& r, uint64_t id,
                                     absl::Duration stall = absl::Seconds(10)) {
  TcpKvSenderOptions o;
  o.stall_timeout = stall;
  auto s = TcpKvSender::Connect(r.endpoint(), id, o);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(s).value();
}

absl::Status SendLayer(KvSender& sender, const PrefillSide& src, uint64_t id,
                       int64_t layer) {
  KvTransferHeader h = src.Header(id, layer);
  std::vector<uint8_t> bytes = src.Export(layer);
  h.checksum = KvChecksum(bytes);
  return sender.SendLayer(h, bytes);
}

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

struct Corruption {
  const char* name;
  void (*apply)(KvTransferHeader&, std::vector<uint8_t>&);
  absl::StatusCode code;
  const char* message;
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
    h.checksum = KvChecksum(bytes);
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
  for (int64_t l = kBad; l < kLayers; ++l) {
    EXPECT_TRUE(decode.Untouched(9, l)) << "layer " << l << " written";
  }
  EXPECT_EQ(decode.Layers(9).size(), static_cast<size_t>(kBad));
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
                   absl::StatusCode::kDataLoss, "checksum mismatch"},
        Corruption{"truncated",
                   [](KvTransferHeader& h, std::vector<uint8_t>& b) {
                     b.resize(b.size() - 1000);
                     h.payload_bytes = b.size();
                     h.checksum = KvChecksum(b);
                   },
                   absl::StatusCode::kInvalidArgument, "payload_bytes"},
        Corruption{"model",
                   [](KvTransferHeader& h, std::vector<uint8_t>&) {
                     h.model_id = "llama-3-8b";
                   },
                   absl::StatusCode::kInvalidArgument, "model_id"}),
    [](const auto& info) { return std::string(info.param.name); });

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
void DisconnectAfter(uint64_t extra_bytes_of_layer1) {
  PrefillSide src(64, 100, 4);
  DecodeSide decode(40);
  decode.Expect(11, 100);
  auto receiver = StartReceiver(decode);
  {
    auto fd = TcpConnect(receiver->endpoint(), absl::Seconds(5));
    ASSERT_TRUE(fd.ok()) << fd.status();
    SocketIoOptions io;
    for (int64_t l = 0; l < 2; ++l) {
      KvFrame f;
      f.header = src.Header(11, l);
      std::vector<uint8_t> bytes = src.Export(l);
      f.header.checksum = KvChecksum(bytes);
      KvFrameBytes head = EncodeKvFrame(f);
      std::string ids = f.header.request_id + f.header.model_id;
      const size_t n = l == 0 ? bytes.size() : extra_bytes_of_layer1;
      iovec iov[3] = {{head.data(), head.size()},
                      {ids.data(), ids.size()},
                      {bytes.data(), n}};
      ASSERT_TRUE(SendAllV(fd->get(), iov, 3, io, "test").ok());
    }
  }  // closes the socket
  absl::Status done = decode.WaitDone(11);
  EXPECT_TRUE(absl::IsUnavailable(done)) << done;
  EXPECT_THAT(done.message(), HasSubstr("after 1 of 30 layers"));
  EXPECT_TRUE(decode.Untouched(11, 1));
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
  const absl::Time start = absl::Now();
  absl::Status done = decode.WaitDone(12);
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(done)) << done;
  // Never a hang: bounded generously, since CI shares 2 cores with other tests.
  EXPECT_LT(took, 10 * kStall);
  // The sender learns it on its next call.
  absl::Status s = SendLayer(*sender, src, 12, 2);
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_TRUE(decode.Untouched(12, 2));
}

TEST(TcpKvTransportTest, SilentReceiverTimesOutSender) {
  int port = 0;
  auto listener = TcpListen("127.0.0.1", 0, &port);
  ASSERT_TRUE(listener.ok());
  const absl::Duration kStall = absl::Milliseconds(300);
  auto sender = TcpKvSender::Connect("127.0.0.1:" + std::to_string(port), 1,
                                     {.stall_timeout = kStall});
  ASSERT_TRUE(sender.ok()) << sender.status();
  // Nobody accepts or reads: buffers fill, then the sender stalls.
  PrefillSide src(64, 100, 6);
  const absl::Time start = absl::Now();
  absl::Status s;
  for (int64_t l = 0; l < kLayers && s.ok(); ++l) {
    s = SendLayer(**sender, src, 1, l);
  }
  if (s.ok()) s = (*sender)->Finish();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_LT(absl::Now() - start, 10 * kStall);
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
  for (int i = 0; i < 500 && decode.Layers(14).empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(decode.Layers(14).size(), 1u);
  const absl::Time start = absl::Now();
  receiver.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  absl::Status done = decode.WaitDone(14, absl::ZeroDuration());
  EXPECT_TRUE(absl::IsCancelled(done)) << done;
}

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
