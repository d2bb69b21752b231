// The NCCL KV transport tests' harness: LoopbackNcclApi, an in-process
// NcclApi over host memory, and NcclKvTransportHarness, a prefill side and a
// decode side sharing one NcclApi (the loopback or the real one).
#ifndef BATON_WORKER_TRANSPORT_NCCL_KV_TRANSPORT_TEST_HARNESS_H_
#define BATON_WORKER_TRANSPORT_NCCL_KV_TRANSPORT_TEST_HARNESS_H_

#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/check.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/kv_cache/kv_cache.h"
#include "worker/transport/nccl_kv_transport.h"

namespace baton::nccl_kv_test {

// An in-process NcclApi: "device" memory is host memory, a stream is a
// queue of copies, sends and receives progressed in order whenever it is
// queried; a send lands in the peer's FIFO at once. A receive whose message
// size differs fails the stream (NCCL would corrupt or hang).
class LoopbackNcclApi : public NcclApi {
 public:
  absl::StatusOr<NcclUniqueIdBytes> GetUniqueId() override {
    absl::MutexLock lock(&mu_);
    NcclUniqueIdBytes id{};
    id[0] = static_cast<uint8_t>(++next_id_);
    return id;
  }
  absl::StatusOr<NcclCommHandle> CommInitRankNonBlocking(
      const NcclUniqueIdBytes& id, int, int rank, int) override {
    absl::MutexLock lock(&mu_);
    ++joins_[id];
    comms_.push_back(std::make_unique<Comm>(Comm{id, rank}));
    return static_cast<NcclCommHandle>(comms_.back().get());
  }
  absl::StatusOr<bool> CommInProgress(NcclCommHandle h) override {
    absl::MutexLock lock(&mu_);
    return joins_[static_cast<Comm*>(h)->id] < 2;
  }
  void CommAbort(NcclCommHandle h) override {
    absl::MutexLock lock(&mu_);
    static_cast<Comm*>(h)->dead = true;
    ++aborts_;
  }
  void CommDestroy(NcclCommHandle h) override {
    absl::MutexLock lock(&mu_);
    static_cast<Comm*>(h)->dead = true;
  }
  absl::StatusOr<NcclStreamHandle> StreamCreate(int) override {
    absl::MutexLock lock(&mu_);
    streams_.push_back(std::make_unique<Stream>());
    return static_cast<NcclStreamHandle>(streams_.back().get());
  }
  void StreamDestroy(int, NcclStreamHandle) override {}
  absl::StatusOr<bool> StreamDone(NcclStreamHandle h) override {
    absl::MutexLock lock(&mu_);
    Stream* s = static_cast<Stream*>(h);
    Progress(*s);
    if (!s->error.ok()) return s->error;
    return s->ops.empty();
  }
  absl::StatusOr<void*> DeviceAlloc(int, uint64_t bytes) override {
    return std::calloc(bytes, 1);
  }
  void DeviceFree(int, void* p) override { std::free(p); }
  absl::StatusOr<void*> HostAlloc(uint64_t bytes) override {
    return std::calloc(bytes, 1);
  }
  void HostFree(void* p) override { std::free(p); }
  absl::Status CopyAsync(int, void* dst, const void* src, uint64_t bytes,
                         NcclStreamHandle h) override {
    absl::MutexLock lock(&mu_);
    Stream* s = static_cast<Stream*>(h);
    s->ops.push_back({Op::kCopy, nullptr, dst, src, bytes});
    Progress(*s);
    return absl::OkStatus();
  }
  absl::Status P2pGroup(int, NcclCommHandle comm, int peer, NcclStreamHandle h,
                        std::span<const P2pOp> ops) override {
    absl::MutexLock lock(&mu_);
    Comm* c = static_cast<Comm*>(comm);
    EXPECT_FALSE(c->dead);
    EXPECT_EQ(peer, 1 - c->rank);
    Stream* s = static_cast<Stream*>(h);
    for (const P2pOp& op : ops) {
      const bool send = op.kind == P2pOp::Kind::kSend;
      s->ops.push_back(
          {send ? Op::kSend : Op::kRecv, c, op.buffer, op.buffer, op.bytes});
    }
    Progress(*s);
    return absl::OkStatus();
  }

  int aborts() {
    absl::MutexLock lock(&mu_);
    return aborts_;
  }

 private:
  struct Comm {
    NcclUniqueIdBytes id;
    int rank;
    bool dead = false;
  };
  struct Op {
    enum Kind { kCopy, kSend, kRecv } kind;
    Comm* comm;
    void* dst;
    const void* src;
    uint64_t bytes;
  };
  struct Stream {
    std::deque<Op> ops;
    absl::Status error;
  };
  using Channel = std::deque<std::vector<uint8_t>>;

  Channel& ChannelFrom(const Comm& c, int from_rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return channels_[{c.id, from_rank}];
  }
  void Progress(Stream& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!s.ops.empty() && s.error.ok()) {
      Op& op = s.ops.front();
      if (op.kind == Op::kCopy) {
        std::memcpy(op.dst, op.src, op.bytes);
      } else if (op.kind == Op::kSend) {
        const uint8_t* p = static_cast<const uint8_t*>(op.src);
        ChannelFrom(*op.comm, op.comm->rank).emplace_back(p, p + op.bytes);
      } else {
        Channel& in = ChannelFrom(*op.comm, 1 - op.comm->rank);
        if (op.comm->dead || in.empty()) return;
        if (in.front().size() != op.bytes) {
          s.error = absl::InternalError("loopback: send/recv size mismatch");
          return;
        }
        std::memcpy(op.dst, in.front().data(), op.bytes);
        in.pop_front();
      }
      s.ops.pop_front();
    }
  }

  absl::Mutex mu_;
  int next_id_ = 0;
  int aborts_ = 0;
  std::map<NcclUniqueIdBytes, int> joins_;
  std::vector<std::unique_ptr<Comm>> comms_;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::map<std::pair<NcclUniqueIdBytes, int>, Channel> channels_;
};

inline constexpr int64_t kNumTokens = 10;  // 3 blocks of 4

inline KvCacheOptions CacheOptions() {
  KvCacheOptions o;
  o.num_layers = 4;
  o.num_kv_heads = 2;
  o.head_dim = 8;
  o.block_size = 4;
  o.num_blocks = 16;
  return o;
}

// Two "workers" sharing one NcclApi: a prefill side with a filled KvCache
// mirrored into device memory, and a decode side with a reserved table and
// an empty device pool.
class NcclKvTransportHarness {
 public:
  NcclKvTransportHarness(NcclApi* api, int sender_device, int receiver_device)
      : api_(api) {
    NcclCommPoolOptions pool_options;
    pool_options.init_timeout = absl::Seconds(20);
    pool_options.poll_interval = absl::Microseconds(50);
    send_pool_ = *NcclCommPool::Create(api, pool_options);
    recv_pool_ = *NcclCommPool::Create(api, pool_options);
    handshake_.comm_key = "prefill-0/decode-0";
    handshake_.generation = 1;
    handshake_.unique_id = *recv_pool_->NewUniqueId();
    handshake_.sender_device = sender_device;
    handshake_.receiver_device = receiver_device;

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

    const uint64_t pool_bytes = send_cache_->pool_bytes();
    stream_ = *api->StreamCreate(sender_device);
    send_device_ = *api->DeviceAlloc(sender_device, pool_bytes);
    Upload(send_device_, send_cache_->LayerBlock(0, 0), pool_bytes);
    recv_device_ = *api->DeviceAlloc(receiver_device, pool_bytes);
    std::vector<uint8_t> zeros(pool_bytes, 0);
    Upload(recv_device_, zeros.data(), pool_bytes);
  }
  ~NcclKvTransportHarness() {
    receiver_.reset();
    for (void* p : staged_) api_->DeviceFree(handshake_.sender_device, p);
    api_->DeviceFree(handshake_.sender_device, send_device_);
    api_->DeviceFree(handshake_.receiver_device, recv_device_);
    api_->StreamDestroy(handshake_.sender_device, stream_);
    send_cache_->Free(send_table_);
    recv_cache_->Free(recv_table_);
    recv_cache_->Free(spacer_);
  }

  void StartReceiver(NcclKvReceiverOptions options = {},
                     std::string expected_model = "smollm") {
    NcclKvReceiverCallbacks cb;
    cb.lookup = [this,
                 expected_model](uint64_t id) -> absl::StatusOr<NcclKvTarget> {
      if (id >= 100) return absl::NotFoundError("no reservation");
      NcclKvTarget t;
      t.target.cache = recv_cache_.get();
      t.target.table = &recv_table_;
      t.target.expected_layout = recv_cache_->layout();
      t.target.num_tokens = kNumTokens;
      t.target.expected_model_id = expected_model;
      t.device_pool = recv_device_;
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
    receiver_ = *NcclKvReceiver::Create(recv_pool_.get(), options, cb);
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
    return {send_device_, send_cache_->num_blocks_total(),
            send_table_.block_ids()};
  }
  // Device address of the layer exported contiguously (staged on device).
  absl::StatusOr<std::span<const uint8_t>> StageLayer(int64_t layer) {
    std::vector<uint8_t> host(send_cache_->LayerBytes(send_table_));
    BATON_CHECK(send_cache_->ExportLayer(send_table_, layer, host).ok());
    void* dev = *api_->DeviceAlloc(handshake_.sender_device, host.size());
    staged_.push_back(dev);
    Upload(dev, host.data(), host.size());
    return std::span<const uint8_t>(static_cast<const uint8_t*>(dev),
                                    host.size());
  }

  std::vector<uint8_t> DownloadReceiverPool() {
    std::vector<uint8_t> out(recv_cache_->pool_bytes());
    BATON_CHECK(api_->CopyAsync(handshake_.receiver_device, out.data(),
                                recv_device_, out.size(), stream_)
                    .ok());
    Sync();
    return out;
  }
  // Whether the receiver's pool holds exactly the sender's layers in
  // `layers` (at the receiver's block ids) and zeros everywhere else.
  ::testing::AssertionResult ReceiverHolds(const std::set<int64_t>& layers) {
    const std::vector<uint8_t> got = DownloadReceiverPool();
    const uint64_t chunk = recv_cache_->chunk_bytes();
    const int64_t nb = recv_cache_->num_blocks_total();
    std::vector<uint8_t> want(got.size(), 0);
    for (int64_t l : layers) {
      for (int64_t i = 0; i < 3; ++i) {
        std::memcpy(&want[(l * nb + recv_table_.block_ids()[i]) * chunk],
                    send_cache_->LayerBlock(l, send_table_.block_ids()[i]),
                    chunk);
      }
    }
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != want[i]) {
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
  absl::StatusOr<absl::Status> DoneStatus(uint64_t id, absl::Duration timeout) {
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

  NcclApi* api_;
  NcclPairHandshake handshake_;
  std::unique_ptr<NcclCommPool> send_pool_, recv_pool_;
  std::unique_ptr<NcclKvReceiver> receiver_;

 private:
  void Upload(void* dst, const void* src, uint64_t bytes) {
    BATON_CHECK(
        api_->CopyAsync(handshake_.sender_device, dst, src, bytes, stream_)
            .ok());
    Sync();
  }
  void Sync() {
    while (!*api_->StreamDone(stream_)) absl::SleepFor(absl::Microseconds(50));
  }

  std::unique_ptr<KvCache> send_cache_, recv_cache_;
  BlockTable send_table_, recv_table_, spacer_;
  NcclStreamHandle stream_ = nullptr;
  void* send_device_ = nullptr;
  void* recv_device_ = nullptr;
  std::vector<void*> staged_;
  absl::Mutex mu_;
  std::map<uint64_t, absl::Status> done_;
  std::vector<int64_t> layers_;
};

// Sends all four layers (even ones staged contiguously, odd ones straight
// from the paged pool) and checks the receiver's device pool byte for byte.
inline void RunFullTransfer(NcclKvTransportHarness& h) {
  h.StartReceiver();
  ASSERT_TRUE(h.receiver_->Expect(h.handshake_, 7).ok());
  auto sender = NcclKvSender::Create(h.send_pool_.get(), h.handshake_, 7);
  ASSERT_TRUE(sender.ok()) << sender.status();
  for (int64_t l = 0; l < 4; ++l) {
    if (l % 2 == 0) {
      auto staged = h.StageLayer(l);
      ASSERT_TRUE(staged.ok());
      ASSERT_TRUE((*sender)->SendLayer(h.Header(7, l), *staged).ok());
    } else {
      absl::Status s = (*sender)->SendLayerFromPool(h.Header(7, l), h.Source());
      ASSERT_TRUE(s.ok()) << s;
    }
  }
  ASSERT_TRUE((*sender)->Finish().ok());
  auto done = h.DoneStatus(7, absl::Seconds(10));
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(done->ok()) << *done;
  EXPECT_THAT(h.layers(), ::testing::ElementsAre(0, 1, 2, 3));
  EXPECT_TRUE(h.ReceiverHolds({0, 1, 2, 3}));
}

}  // namespace baton::nccl_kv_test

#endif  // BATON_WORKER_TRANSPORT_NCCL_KV_TRANSPORT_TEST_HARNESS_H_
