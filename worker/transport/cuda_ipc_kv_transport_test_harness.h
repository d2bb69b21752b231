// The CUDA IPC transport tests' harness: a prefill side whose host KvCache
// doubles as its "device" pool and a decode side over a registered "device"
// allocation, both through FakeCudaIpcApi.
#ifndef BATON_WORKER_TRANSPORT_CUDA_IPC_KV_TRANSPORT_TEST_HARNESS_H_
#define BATON_WORKER_TRANSPORT_CUDA_IPC_KV_TRANSPORT_TEST_HARNESS_H_

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/kv_cache/kv_cache.h"
#include "worker/transport/cuda_ipc_fake_api.h"
#include "worker/transport/cuda_ipc_kv_transport.h"

namespace baton::cuda_ipc_test {

inline constexpr int64_t kNumTokens = 10;  // 3 blocks of 4
inline constexpr uint64_t kPoolOffset =
    256;                                  // the pool sits inside its allocation
inline constexpr uint64_t kShortId = 50;  // lookup gives a 1-block table
inline constexpr uint64_t kSecondId = 21;  // lookup gives the second table

KvCacheOptions CacheOptions() {
  KvCacheOptions o;
  o.num_layers = 4;
  o.num_kv_heads = 2;
  o.head_dim = 8;
  o.block_size = 4;
  o.num_blocks = 16;
  return o;
}

// A prefill side whose host KvCache doubles as its "device" pool, and a
// decode side with reserved tables over a registered "device" allocation.
class CudaIpcHarness {
 public:
  CudaIpcHarness() {
    send_cache_ = *KvCache::Create(CacheOptions());
    recv_cache_ = *KvCache::Create(CacheOptions());
    BATON_CHECK(send_cache_->Reserve(send_table_, kNumTokens).ok());
    BATON_CHECK(send_cache_->SetNumTokens(send_table_, kNumTokens).ok());
    std::mt19937 rng(1234);
    std::normal_distribution<float> dist;
    const int64_t kv_dim = send_cache_->layout().kv_dim();
    std::vector<float> k(kNumTokens * kv_dim), v(k.size());
    for (int64_t l = 0; l < 4; ++l) {
      for (float& x : k) x = dist(rng);
      for (float& x : v) x = dist(rng);
      send_cache_->WriteKvRange(send_table_, l, 0, kNumTokens, k.data(),
                                v.data());
    }
    BATON_CHECK(recv_cache_->Reserve(spacer_, 5).ok());  // offsets block ids
    BATON_CHECK(recv_cache_->Reserve(recv_table_, kNumTokens).ok());
    BATON_CHECK(recv_cache_->Reserve(second_table_, kNumTokens).ok());
    BATON_CHECK(recv_cache_->Reserve(short_table_, 4).ok());
    recv_alloc_.assign(kPoolOffset + recv_cache_->pool_bytes() + 64, 0);
    api_.RegisterAllocation(0, recv_alloc_.data(), recv_alloc_.size());
    mappings_ = *CudaIpcPeerMappings::Create(&api_, 0);
  }
  ~CudaIpcHarness() {
    receiver_.reset();
    send_cache_->Free(send_table_);
    for (BlockTable* t :
         {&recv_table_, &second_table_, &short_table_, &spacer_}) {
      recv_cache_->Free(*t);
    }
  }

  // A non-empty `secret` is every transfer's (null secret callback: any
  // proof is accepted).
  void StartReceiver(CudaIpcKvReceiverOptions options = {},
                     std::string expected_model = "smollm",
                     std::string secret = "") {
    options.outstanding_grant_grace = absl::Milliseconds(10);
    CudaIpcKvReceiverCallbacks cb;
    if (!secret.empty()) {
      cb.secret = [secret](uint64_t) -> absl::StatusOr<std::string> {
        return secret;
      };
    }
    cb.lookup =
        [this, expected_model](uint64_t id) -> absl::StatusOr<CudaIpcKvTarget> {
      if (id >= 100) return absl::NotFoundError("no reservation");
      CudaIpcKvTarget t;
      t.target.cache = recv_cache_.get();
      t.target.table = id == kShortId    ? &short_table_
                       : id == kSecondId ? &second_table_
                                         : &recv_table_;
      t.target.expected_layout = recv_cache_->layout();
      t.target.num_tokens = kNumTokens;
      t.target.expected_model_id = expected_model;
      t.device_pool = recv_alloc_.data() + kPoolOffset;
      return t;
    };
    cb.on_layer = [this](uint64_t, int64_t layer) {
      absl::MutexLock lock(&mu_);
      layers_.push_back(layer);
    };
    cb.on_done = [this](uint64_t id, absl::Status s) {
      absl::MutexLock lock(&mu_);
      EXPECT_FALSE(done_.contains(id)) << "on_done twice for " << id;
      done_[id] = s;
    };
    auto receiver = CudaIpcKvReceiver::Start(&api_, options, cb);
    BATON_CHECK(receiver.ok());
    receiver_ = *std::move(receiver);
  }

  std::unique_ptr<CudaIpcKvSender> Connect(
      uint64_t id, CudaIpcKvSenderOptions options = {}) {
    auto sender = CudaIpcKvSender::Connect(mappings_.get(),
                                           receiver_->endpoint(), id, options);
    EXPECT_TRUE(sender.ok()) << sender.status();
    return sender.ok() ? *std::move(sender) : nullptr;
  }

  KvTransferHeader Header(uint64_t id, int64_t layer) const {
    KvTransferHeader h;
    h.transfer_id = id;
    h.request_id = "req-" + std::to_string(id);
    h.model_id = "smollm";
    h.layout = send_cache_->layout();
    h.num_tokens = kNumTokens;
    h.layer = layer;
    h.payload_bytes = send_cache_->LayerBytes(send_table_);
    return h;
  }
  KvDeviceLayerSource Source() const {
    return {send_cache_->LayerBlock(0, 0), send_cache_->num_blocks_total(),
            send_table_.block_ids()};
  }
  std::vector<uint8_t> Exported(int64_t layer) const {
    std::vector<uint8_t> out(send_cache_->LayerBytes(send_table_));
    BATON_CHECK(send_cache_->ExportLayer(send_table_, layer, out).ok());
    return out;
  }
  std::vector<std::span<const uint8_t>> Chunks(int64_t layer) const {
    return *send_cache_->LayerChunks(send_table_, layer, kNumTokens);
  }
  // Sends every layer through SendLayerFromPool and finishes.
  absl::Status SendAll(CudaIpcKvSender& sender, uint64_t id) {
    for (int64_t l = 0; l < 4; ++l) {
      if (absl::Status s = sender.SendLayerFromPool(Header(id, l), Source());
          !s.ok()) {
        return s;
      }
    }
    return sender.Finish();
  }

  // Whether the receiver's allocation holds exactly the sender's `layers`
  // at the blocks of the tables in `tables`, and zeros everywhere else.
  ::testing::AssertionResult ReceiverHolds(
      const std::set<int64_t>& layers,
      std::vector<const BlockTable*> tables = {}) {
    if (tables.empty()) tables = {&recv_table_};
    const uint64_t chunk = recv_cache_->chunk_bytes();
    const int64_t nb = recv_cache_->num_blocks_total();
    std::vector<uint8_t> want(recv_alloc_.size(), 0);
    for (const BlockTable* t : tables) {
      for (int64_t l : layers) {
        for (int64_t i = 0; i < 3; ++i) {
          std::memcpy(&want[kPoolOffset + (l * nb + t->block_ids()[i]) * chunk],
                      send_cache_->LayerBlock(l, send_table_.block_ids()[i]),
                      chunk);
        }
      }
    }
    for (size_t i = 0; i < want.size(); ++i) {
      if (recv_alloc_[i] != want[i]) {
        return ::testing::AssertionFailure() << "byte " << i << " differs";
      }
    }
    return ::testing::AssertionSuccess();
  }

  // Whether on_done has reported `id` (so far).
  bool Reported(uint64_t id) {
    absl::MutexLock lock(&mu_);
    return done_.contains(id);
  }
  absl::StatusOr<absl::Status> DoneStatus(
      uint64_t id, absl::Duration timeout = absl::Seconds(10)) {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      {
        absl::MutexLock lock(&mu_);
        if (auto it = done_.find(id); it != done_.end()) return it->second;
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
    return absl::DeadlineExceededError("on_done not called");
  }
  std::vector<int64_t> layers() {
    absl::MutexLock lock(&mu_);
    return layers_;
  }

  FakeCudaIpcApi api_;
  std::unique_ptr<CudaIpcPeerMappings> mappings_;
  std::unique_ptr<CudaIpcKvReceiver> receiver_;
  BlockTable recv_table_, second_table_;

 private:
  std::unique_ptr<KvCache> send_cache_, recv_cache_;
  BlockTable send_table_, short_table_, spacer_;
  std::vector<uint8_t> recv_alloc_;
  absl::Mutex mu_;
  std::map<uint64_t, absl::Status> done_;
  std::vector<int64_t> layers_;
};

class CudaIpcKvTransportTest : public ::testing::Test {
 protected:
  CudaIpcHarness h_;
};

}  // namespace baton::cuda_ipc_test

#endif  // BATON_WORKER_TRANSPORT_CUDA_IPC_KV_TRANSPORT_TEST_HARNESS_H_
