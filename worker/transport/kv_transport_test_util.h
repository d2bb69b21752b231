// Test fixtures shared by the KV transport tests: a prefill-side pool with
// random K/V, a decode side that reserves blocks and records outcomes, and
// helpers to start a receiver and send layers.
#ifndef BATON_WORKER_TRANSPORT_KV_TRANSPORT_TEST_UTIL_H_
#define BATON_WORKER_TRANSPORT_KV_TRANSPORT_TEST_UTIL_H_

#include <poll.h>
#include <sys/socket.h>

#include <atomic>
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
#include "worker/transport/kv_transport.h"
#include "worker/transport/kv_wire.h"
#include "worker/transport/socket_io.h"
#include "worker/transport/tcp_kv_transport.h"

namespace baton::kvtest {

using ::testing::HasSubstr;

constexpr int64_t kLayers = 30;
constexpr uint8_t kSentinel = 0x5A;
// chunk_bytes() of MakeCache's layout: K and V x 3 heads x 16 slots x 64
// dims x 2 bytes (F16). KvChecksum of a layer payload hashes these pieces.
constexpr uint64_t kChunkBytes = 2 * 3 * 16 * 64 * 2;

inline std::unique_ptr<KvCache> MakeCache(int64_t num_blocks) {
  KvCacheOptions o;
  o.num_layers = kLayers;
  o.num_kv_heads = 3;
  o.head_dim = 64;
  o.block_size = 16;
  o.num_blocks = num_blocks;
  auto cache = KvCache::Create(o);
  EXPECT_TRUE(cache.ok()) << cache.status();
  EXPECT_EQ((*cache)->chunk_bytes(), kChunkBytes);
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

  // Reserves num_tokens and fills every layer of the blocks with kSentinel;
  // the transfer's sender must prove `secret`, and send the blocks from
  // first_block on (the receiver holds those before it).
  void Expect(uint64_t id, int64_t num_tokens, std::string secret = "",
              int64_t first_block = 0) {
    absl::MutexLock lock(&mu_);
    secrets_[id] = std::move(secret);
    first_blocks_[id] = first_block;
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
    cb.secret = [this](uint64_t id) -> absl::StatusOr<std::string> {
      absl::MutexLock lock(&mu_);
      auto it = secrets_.find(id);
      if (it == secrets_.end()) {
        return absl::NotFoundError("no reservation for transfer " +
                                   std::to_string(id));
      }
      return it->second;
    };
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
      t.first_block = first_blocks_[id];
      t.expected_model_id = "smollm2-135m";
      t.expected_request_id = "req-" + std::to_string(id);
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

  // Whether on_done came for the transfer (so far).
  bool Reported(uint64_t id) {
    absl::MutexLock lock(&mu_);
    return done_.count(id) > 0;
  }

  std::vector<int64_t> Layers(uint64_t id) {
    absl::MutexLock lock(&mu_);
    return layers_[id];
  }

  // True if every byte of (layer) in the transfer's blocks [first, end) is
  // kSentinel (end -1: every block).
  bool Untouched(uint64_t id, int64_t layer, int64_t first = 0,
                 int64_t end = -1) {
    absl::MutexLock lock(&mu_);
    const BlockTable& t = tables_[id];
    std::span<const int32_t> ids = t.block_ids();
    if (end >= 0) ids = ids.first(static_cast<size_t>(end));
    for (int32_t b : ids.subspan(static_cast<size_t>(first))) {
      const uint8_t* p = cache_->LayerBlock(layer, b);
      for (uint64_t i = 0; i < cache_->chunk_bytes(); ++i) {
        if (p[i] != kSentinel) return false;
      }
    }
    return true;
  }

  // Every token of `layer` from position `from` on reads back as in the
  // sender's pool.
  void ExpectSameKv(uint64_t id, const PrefillSide& src, int64_t layer,
                    int64_t from = 0) {
    absl::MutexLock lock(&mu_);
    const BlockTable& t = tables_[id];
    const size_t dim = static_cast<size_t>(cache_->layout().kv_dim());
    std::vector<float> k0(dim), v0(dim), k1(dim), v1(dim);
    for (int64_t pos = from; pos < src.table.num_tokens(); ++pos) {
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
  std::map<uint64_t, int64_t> first_blocks_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::string> secrets_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::vector<int64_t>> layers_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, absl::Status> done_ ABSL_GUARDED_BY(mu_);
};

inline std::unique_ptr<TcpKvReceiver> StartReceiver(
    DecodeSide& decode, const TcpKvReceiverOptions& o) {
  auto r = TcpKvReceiver::Start(o, decode.Callbacks());
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_GT((*r)->port(), 0);
  return std::move(r).value();
}

inline std::unique_ptr<TcpKvReceiver> StartReceiver(
    DecodeSide& decode, absl::Duration stall = absl::Seconds(10)) {
  TcpKvReceiverOptions o;
  o.stall_timeout = stall;
  return StartReceiver(decode, o);
}

inline std::unique_ptr<TcpKvSender> Connect(const KvReceiver& r, uint64_t id,
                                            const TcpKvSenderOptions& o) {
  auto s = TcpKvSender::Connect(r.endpoint(), id, o);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(s).value();
}

inline std::unique_ptr<TcpKvSender> Connect(
    const KvReceiver& r, uint64_t id, absl::Duration stall = absl::Seconds(10),
    size_t send_call_bytes = TcpKvSenderOptions().send_call_bytes,
    const std::string& secret = "") {
  TcpKvSenderOptions o;
  o.stall_timeout = stall;
  o.send_call_bytes = send_call_bytes;
  o.transfer_secret = secret;
  return Connect(r, id, o);
}

// Sends `layer` from a contiguous export with checksum 0: the sender hashes
// it as it goes out.
inline absl::Status SendLayer(KvSender& sender, const PrefillSide& src,
                              uint64_t id, int64_t layer) {
  KvTransferHeader h = src.Header(id, layer);
  std::vector<uint8_t> bytes = src.Export(layer);
  return sender.SendLayer(h, bytes);
}

}  // namespace baton::kvtest

#endif  // BATON_WORKER_TRANSPORT_KV_TRANSPORT_TEST_UTIL_H_
