#include "worker/transport/nccl_comm_pool.h"

#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

// A fake NcclApi that records every call. A communicator is ready once its
// unique id was marked joined (the peer "arrived"); a stream is done unless
// streams are held.
class FakeNcclApi : public NcclApi {
 public:
  struct Comm {
    NcclUniqueIdBytes id;
    int rank = -1;
    int device = -1;
    bool aborted = false;
    bool destroyed = false;
  };

  absl::StatusOr<NcclUniqueIdBytes> GetUniqueId() override {
    absl::MutexLock lock(&mu_);
    NcclUniqueIdBytes id{};
    id[0] = static_cast<uint8_t>(++next_id_);
    return id;
  }
  absl::StatusOr<NcclCommHandle> CommInitRankNonBlocking(
      const NcclUniqueIdBytes& id, int nranks, int rank, int device) override {
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(nranks, 2);
    comms_.push_back(std::make_unique<Comm>(Comm{id, rank, device}));
    return static_cast<NcclCommHandle>(comms_.back().get());
  }
  absl::StatusOr<bool> CommInProgress(NcclCommHandle handle) override {
    absl::MutexLock lock(&mu_);
    Comm* c = static_cast<Comm*>(handle);
    EXPECT_FALSE(c->aborted || c->destroyed) << "use after abort/destroy";
    if (!async_error_.ok()) return async_error_;
    return !joined_.contains(c->id);
  }
  void CommAbort(NcclCommHandle handle) override {
    absl::MutexLock lock(&mu_);
    Comm* c = static_cast<Comm*>(handle);
    EXPECT_FALSE(c->aborted || c->destroyed) << "aborted twice";
    c->aborted = true;
  }
  void CommDestroy(NcclCommHandle handle) override {
    absl::MutexLock lock(&mu_);
    Comm* c = static_cast<Comm*>(handle);
    EXPECT_FALSE(c->aborted || c->destroyed) << "destroyed twice";
    c->destroyed = true;
  }
  absl::StatusOr<NcclStreamHandle> StreamCreate(int) override {
    absl::MutexLock lock(&mu_);
    ++live_streams_;
    return reinterpret_cast<NcclStreamHandle>(uintptr_t{0x1000});
  }
  void StreamDestroy(int, NcclStreamHandle) override {
    absl::MutexLock lock(&mu_);
    --live_streams_;
  }
  absl::StatusOr<bool> StreamDone(NcclStreamHandle) override {
    absl::MutexLock lock(&mu_);
    ++stream_polls_;
    return !hold_streams_;
  }
  absl::StatusOr<void*> DeviceAlloc(int, uint64_t bytes) override {
    absl::MutexLock lock(&mu_);
    ++live_allocations_;
    return std::malloc(bytes);
  }
  void DeviceFree(int, void* p) override {
    absl::MutexLock lock(&mu_);
    --live_allocations_;
    std::free(p);
  }
  absl::StatusOr<void*> HostAlloc(uint64_t bytes) override {
    return DeviceAlloc(0, bytes);
  }
  void HostFree(void* p) override { DeviceFree(0, p); }
  absl::Status CopyAsync(int, void*, const void*, uint64_t,
                         NcclStreamHandle) override {
    return absl::OkStatus();
  }
  absl::Status P2pGroup(int, NcclCommHandle handle, int, NcclStreamHandle,
                        std::span<const P2pOp> ops) override {
    absl::MutexLock lock(&mu_);
    Comm* c = static_cast<Comm*>(handle);
    EXPECT_FALSE(c->aborted || c->destroyed) << "enqueue after abort";
    p2p_ops_ += ops.size();
    return absl::OkStatus();
  }

  // --- Test controls ---
  void Join(const NcclUniqueIdBytes& id) {
    absl::MutexLock lock(&mu_);
    joined_.insert(id);
  }
  void HoldStreams(bool hold) {
    absl::MutexLock lock(&mu_);
    hold_streams_ = hold;
  }
  void SetAsyncError(absl::Status s) {
    absl::MutexLock lock(&mu_);
    async_error_ = std::move(s);
  }
  // Blocks until StreamDone has been called at least `n` times in all.
  void AwaitStreamPolls(int n) {
    absl::MutexLock lock(&mu_);
    auto polled = [&] { return stream_polls_ >= n; };
    mu_.Await(absl::Condition(&polled));
  }
  int num_inits() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(comms_.size());
  }
  Comm comm(int i) {
    absl::MutexLock lock(&mu_);
    return *comms_.at(i);
  }
  int live_resources() {
    absl::MutexLock lock(&mu_);
    return live_allocations_ + live_streams_;
  }
  size_t p2p_ops() {
    absl::MutexLock lock(&mu_);
    return p2p_ops_;
  }

 private:
  absl::Mutex mu_;
  int next_id_ = 0;
  std::vector<std::unique_ptr<Comm>> comms_;
  std::set<NcclUniqueIdBytes> joined_;
  bool hold_streams_ = false;
  absl::Status async_error_;
  int live_allocations_ = 0;
  int live_streams_ = 0;
  size_t p2p_ops_ = 0;
  int stream_polls_ = 0;
};

NcclPairHandshake Handshake(FakeNcclApi& api, uint64_t generation,
                            bool joined = true) {
  NcclPairHandshake h;
  h.comm_key = "prefill-0/decode-1";
  h.generation = generation;
  h.unique_id = *api.GetUniqueId();
  h.sender_rank = 1;
  h.receiver_rank = 0;
  h.sender_device = 2;
  h.receiver_device = 3;
  if (joined) api.Join(h.unique_id);
  return h;
}

std::unique_ptr<NcclCommPool> MakePool(FakeNcclApi& api,
                                       NcclCommPoolOptions options = {}) {
  options.poll_interval = absl::Microseconds(100);
  auto pool = NcclCommPool::Create(&api, options);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return *std::move(pool);
}

TEST(NcclCommPoolTest, CreatesLazilyAndReusesPerPair) {
  FakeNcclApi api;
  auto pool = MakePool(api);
  EXPECT_EQ(api.num_inits(), 0);
  const NcclPairHandshake h = Handshake(api, 1);
  auto a = pool->GetOrCreate(h, NcclPairRole::kSender);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = pool->GetOrCreate(h, NcclPairRole::kSender);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->get(), b->get());
  EXPECT_EQ(api.num_inits(), 1);
  EXPECT_EQ(pool->num_pairs(), 1);
  EXPECT_EQ((*a)->rank(), 1);
  EXPECT_EQ((*a)->peer(), 0);
  EXPECT_EQ((*a)->device(), 2);
  EXPECT_EQ(api.comm(0).rank, 1);
  EXPECT_EQ(api.comm(0).device, 2);
  EXPECT_TRUE((*a)->health().ok());
  EXPECT_NE((*a)->device_send_control(), nullptr);
  EXPECT_NE((*a)->host_recv_control(), nullptr);
}

TEST(NcclCommPoolTest, ReceiverRoleUsesReceiverRankAndDevice) {
  FakeNcclApi api;
  auto pool = MakePool(api);
  auto pair = pool->GetOrCreate(Handshake(api, 1), NcclPairRole::kReceiver);
  ASSERT_TRUE(pair.ok()) << pair.status();
  EXPECT_EQ((*pair)->rank(), 0);
  EXPECT_EQ((*pair)->peer(), 1);
  EXPECT_EQ((*pair)->device(), 3);
}

TEST(NcclCommPoolTest, JoinTimeoutAbortsAndPoisonsTheGeneration) {
  FakeNcclApi api;
  NcclCommPoolOptions options;
  options.init_timeout = absl::Milliseconds(50);
  auto pool = MakePool(api, options);
  // The peer never joins: only init_timeout ends the join.
  const NcclPairHandshake h = Handshake(api, 1, /*joined=*/false);
  auto pair = pool->GetOrCreate(h, NcclPairRole::kSender);
  EXPECT_EQ(pair.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(pair.status().message(), HasSubstr("prefill-0/decode-1"));
  EXPECT_THAT(
      pair.status().message(),
      HasSubstr(absl::StrCat("peer did not join the communicator within ",
                             absl::FormatDuration(options.init_timeout))));
  EXPECT_TRUE(api.comm(0).aborted);

  // The same generation cannot be retried: its unique id is spent.
  auto again = pool->GetOrCreate(h, NcclPairRole::kSender);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(api.num_inits(), 1);

  // A newer generation joins afresh.
  auto fresh = pool->GetOrCreate(Handshake(api, 2), NcclPairRole::kSender);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ((*fresh)->generation(), 2u);
  EXPECT_EQ(api.num_inits(), 2);
}

TEST(NcclCommPoolTest, HigherGenerationReplacesLowerIsRefused) {
  FakeNcclApi api;
  auto pool = MakePool(api);
  auto old_pair = pool->GetOrCreate(Handshake(api, 4), NcclPairRole::kSender);
  ASSERT_TRUE(old_pair.ok());
  auto new_pair = pool->GetOrCreate(Handshake(api, 5), NcclPairRole::kSender);
  ASSERT_TRUE(new_pair.ok()) << new_pair.status();
  EXPECT_NE(old_pair->get(), new_pair->get());
  EXPECT_TRUE(api.comm(0).aborted);
  EXPECT_FALSE(api.comm(1).aborted);
  EXPECT_THAT((*old_pair)->health().message(), HasSubstr("replaced"));
  EXPECT_EQ(*pool->generation("prefill-0/decode-1"), 5u);
  EXPECT_EQ(pool->num_pairs(), 1);

  auto stale = pool->GetOrCreate(Handshake(api, 3), NcclPairRole::kSender);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(stale.status().message(), HasSubstr("older"));
}

TEST(NcclCommPoolTest, PeerDeathAbortsOnceAndFailsLaterWaits) {
  FakeNcclApi api;
  auto pool = MakePool(api);
  const NcclPairHandshake h = Handshake(api, 1);
  auto pair = pool->GetOrCreate(h, NcclPairRole::kReceiver);
  ASSERT_TRUE(pair.ok());
  pool->Abort(h.comm_key, absl::UnavailableError("decode-1 missed heartbeats"));
  pool->Abort(h.comm_key, absl::UnavailableError("again"));  // no double abort
  EXPECT_TRUE(api.comm(0).aborted);
  const absl::Status health = (*pair)->health();
  EXPECT_EQ(health.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(health.message(), HasSubstr("missed heartbeats"));
  EXPECT_EQ((*pair)->Wait(absl::Now() + absl::Seconds(1), "x").code(),
            absl::StatusCode::kUnavailable);
  const NcclApi::P2pOp op{NcclApi::P2pOp::Kind::kSend, nullptr, 8};
  EXPECT_FALSE((*pair)->P2pGroup({&op, 1}).ok());
  EXPECT_EQ(api.p2p_ops(), 0u);
  // Same generation stays unusable; no new join is attempted.
  auto again = pool->GetOrCreate(h, NcclPairRole::kReceiver);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(api.num_inits(), 1);
  pool->Abort("no/such-pair", absl::UnavailableError("ignored"));
}

TEST(NcclCommPoolTest, WaitPastDeadlineAbortsTheCommunicator) {
  FakeNcclApi api;
  auto pool = MakePool(api);
  auto pair = pool->GetOrCreate(Handshake(api, 1), NcclPairRole::kSender);
  ASSERT_TRUE(pair.ok());
  const NcclApi::P2pOp op{NcclApi::P2pOp::Kind::kSend, nullptr, 64};
  ASSERT_TRUE((*pair)->P2pGroup({&op, 1}).ok());
  api.HoldStreams(true);  // the peer never receives: only the deadline ends it
  const absl::Status s =
      (*pair)->Wait(absl::Now() + absl::Milliseconds(30), "layer 3 payload");
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(),
              HasSubstr("layer 3 payload did not complete in time; "
                        "communicator aborted"));
  EXPECT_TRUE(api.comm(0).aborted);
  EXPECT_EQ((*pair)->health().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(NcclCommPoolTest, WaitCompletesWhenStreamDrains) {
  FakeNcclApi api;
  auto pool = MakePool(api);
  auto pair = pool->GetOrCreate(Handshake(api, 1), NcclPairRole::kSender);
  ASSERT_TRUE(pair.ok());
  api.HoldStreams(true);
  std::thread release([&] {
    absl::SleepFor(absl::Milliseconds(20));
    api.HoldStreams(false);
  });
  EXPECT_TRUE((*pair)->Wait(absl::Now() + absl::Seconds(10), "x").ok());
  release.join();
  EXPECT_FALSE(api.comm(0).aborted);
}

TEST(NcclCommPoolTest, AsyncErrorAbortsWithUnavailable) {
  FakeNcclApi api;
  auto pool = MakePool(api);
  auto pair = pool->GetOrCreate(Handshake(api, 1), NcclPairRole::kSender);
  ASSERT_TRUE(pair.ok());
  api.SetAsyncError(absl::UnavailableError("ncclRemoteError"));
  const absl::Status s = (*pair)->Wait(absl::Now() + absl::Seconds(10), "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("ncclRemoteError"));
  EXPECT_TRUE(api.comm(0).aborted);
}

TEST(NcclCommPoolTest, AbortFromAnotherThreadEndsAWait) {
  FakeNcclApi api;
  auto pool = MakePool(api);
  auto pair = pool->GetOrCreate(Handshake(api, 1), NcclPairRole::kSender);
  ASSERT_TRUE(pair.ok());
  api.HoldStreams(true);
  // Aborts once the Wait below has polled the held stream. Had the abort not
  // ended the wait, its 30s deadline would, with DeadlineExceeded.
  std::thread killer([&] {
    api.AwaitStreamPolls(1);
    pool->Abort("prefill-0/decode-1", absl::UnavailableError("peer died"));
  });
  const absl::Status s = (*pair)->Wait(absl::Now() + absl::Seconds(30), "x");
  killer.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("peer died"));
}

TEST(NcclCommPoolTest, StopCallbackCancelsAWait) {
  FakeNcclApi api;
  auto pool = MakePool(api);
  auto pair = pool->GetOrCreate(Handshake(api, 1), NcclPairRole::kSender);
  ASSERT_TRUE(pair.ok());
  api.HoldStreams(true);
  std::atomic<int> polls{0};
  const absl::Status s = (*pair)->Wait(absl::Now() + absl::Seconds(30), "x",
                                       [&] { return ++polls > 3; });
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(api.comm(0).aborted);
}

TEST(NcclCommPoolTest, ConcurrentCallersShareOneJoin) {
  FakeNcclApi api;
  auto pool = MakePool(api);
  const NcclPairHandshake h = Handshake(api, 1, /*joined=*/false);
  std::vector<std::shared_ptr<NcclPairComm>> got(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      auto p = pool->GetOrCreate(h, NcclPairRole::kSender);
      EXPECT_TRUE(p.ok()) << p.status();
      if (p.ok()) got[i] = *p;
    });
  }
  absl::SleepFor(absl::Milliseconds(30));
  api.Join(h.unique_id);
  for (auto& t : threads) t.join();
  EXPECT_EQ(api.num_inits(), 1);
  for (int i = 1; i < 4; ++i) EXPECT_EQ(got[i], got[0]);
}

TEST(NcclCommPoolTest, MaxPairsIsResourceExhausted) {
  FakeNcclApi api;
  NcclCommPoolOptions options;
  options.max_pairs = 2;
  auto pool = MakePool(api, options);
  for (int i = 0; i < 3; ++i) {
    NcclPairHandshake h = Handshake(api, 1);
    h.comm_key = "prefill-" + std::to_string(i) + "/decode-0";
    auto pair = pool->GetOrCreate(h, NcclPairRole::kSender);
    if (i < 2) {
      EXPECT_TRUE(pair.ok()) << pair.status();
    } else {
      EXPECT_EQ(pair.status().code(), absl::StatusCode::kResourceExhausted);
      EXPECT_THAT(pair.status().message(), HasSubstr("max_pairs=2"));
    }
  }
  pool->Release("prefill-0/decode-0");
  EXPECT_EQ(pool->num_pairs(), 1);
  EXPECT_EQ(pool->generation("prefill-0/decode-0").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(NcclCommPoolTest, ReleasesEveryResource) {
  FakeNcclApi api;
  {
    auto pool = MakePool(api);
    auto idle = pool->GetOrCreate(Handshake(api, 1), NcclPairRole::kSender);
    ASSERT_TRUE(idle.ok());
    idle->reset();
    NcclPairHandshake other = Handshake(api, 1);
    other.comm_key = "prefill-9/decode-9";
    auto busy = pool->GetOrCreate(other, NcclPairRole::kSender);
    ASSERT_TRUE(busy.ok());
    EXPECT_GT(api.live_resources(), 0);
    pool.reset();
    // Still held by a user when the pool went: aborted, alive until let go.
    EXPECT_TRUE(api.comm(1).aborted);
    EXPECT_FALSE((*busy)->health().ok());
  }
  EXPECT_TRUE(api.comm(0).destroyed);  // idle and healthy: destroyed
  EXPECT_EQ(api.live_resources(), 0);
}

TEST(NcclCommPoolTest, RejectsBadHandshakes) {
  FakeNcclApi api;
  auto pool = MakePool(api);
  NcclPairHandshake h = Handshake(api, 1);
  h.comm_key.clear();
  EXPECT_EQ(pool->GetOrCreate(h, NcclPairRole::kSender).status().code(),
            absl::StatusCode::kInvalidArgument);
  h = Handshake(api, 1);
  h.nranks = 3;
  EXPECT_THAT(ValidateNcclHandshake(h).message(), HasSubstr("nranks"));
  h = Handshake(api, 1);
  h.receiver_rank = h.sender_rank;
  EXPECT_THAT(ValidateNcclHandshake(h).message(), HasSubstr("rank"));
  h = Handshake(api, 1);
  h.sender_device = -1;
  EXPECT_THAT(ValidateNcclHandshake(h).message(), HasSubstr("device"));
  EXPECT_EQ(api.num_inits(), 0);

  EXPECT_EQ(NcclUniqueIdFromBytes(std::string(127, 'x')).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto id = NcclUniqueIdFromBytes(std::string(128, '\x07'));
  ASSERT_TRUE(id.ok());
  EXPECT_EQ((*id)[127], 7);
  EXPECT_FALSE(NcclCommPool::Create(nullptr).ok());
  NcclCommPoolOptions bad;
  bad.max_pairs = 0;
  EXPECT_FALSE(NcclCommPool::Create(&api, bad).ok());
}

TEST(NcclCommPoolTest, NewUniqueIdsDiffer) {
  FakeNcclApi api;
  auto pool = MakePool(api);
  auto a = pool->NewUniqueId();
  auto b = pool->NewUniqueId();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
}

}  // namespace
}  // namespace baton
