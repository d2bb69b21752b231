#include "coordinator/worker_registry.h"

#include <cmath>
#include <cstdint>
#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

KvLayout SmolLayout() {
  KvLayout layout;
  layout.num_layers = 30;
  layout.num_kv_heads = 3;
  layout.head_dim = 64;
  layout.block_size = 16;
  layout.dtype = DType::kF16;
  return layout;
}

WorkerRegistration Reg(WorkerRole role, std::string address,
                       int64_t blocks = 100) {
  WorkerRegistration reg;
  reg.role = role;
  reg.address = std::move(address);
  reg.model_id = "smollm2-135m";
  reg.kv_layout = SmolLayout();
  reg.kv_blocks_total = blocks;
  reg.context_length = 2048;
  return reg;
}

class WorkerRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WorkerRegistryOptions options;
    options.heartbeat_interval = absl::Seconds(1);
    options.suspect_after = absl::Seconds(2);
    options.lease_ttl = absl::Seconds(5);
    auto registry = WorkerRegistry::Create(options, &clock_);
    ASSERT_TRUE(registry.ok()) << registry.status();
    registry_ = std::move(*registry);
  }

  WorkerHealth Health(const WorkerRef& ref) {
    auto info = registry_->Get(ref.id);
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->health : WorkerHealth::kDown;
  }

  FakeClock clock_;
  std::unique_ptr<WorkerRegistry> registry_;
};

TEST_F(WorkerRegistryTest, RejectsMisorderedOptions) {
  WorkerRegistryOptions options;
  options.suspect_after = absl::Seconds(10);
  options.lease_ttl = absl::Seconds(5);
  auto registry = WorkerRegistry::Create(options, &clock_);
  EXPECT_EQ(registry.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(registry.status().message(), HasSubstr("suspect_after=10s"));
}

TEST_F(WorkerRegistryTest, RegistersWithIdsEpochsAndFullPool) {
  auto a = registry_->Register(Reg(WorkerRole::kPrefill, "10.0.0.1:1", 0));
  auto b = registry_->Register(Reg(WorkerRole::kDecode, "10.0.0.2:1", 64));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*a, (WorkerRef{"w1", 1}));
  EXPECT_EQ(*b, (WorkerRef{"w2", 2}));
  std::vector<WorkerInfo> all = registry_->List();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[1].registration.role, WorkerRole::kDecode);
  EXPECT_EQ(all[1].load.kv_blocks_free, 64);
  EXPECT_EQ(all[1].load.kv_blocks_total, 64);
  EXPECT_EQ(all[1].health, WorkerHealth::kHealthy);
}

TEST_F(WorkerRegistryTest, RejectsBadRegistrationsNamingTheField) {
  WorkerRegistration reg = Reg(WorkerRole::kDecode, "");
  EXPECT_THAT(registry_->Register(reg).status().message(),
              HasSubstr("address"));
  reg = Reg(WorkerRole::kDecode, "h:1");
  reg.model_id.clear();
  EXPECT_THAT(registry_->Register(reg).status().message(),
              HasSubstr("model_id"));
  reg = Reg(WorkerRole::kDecode, "h:1", 0);
  absl::Status s = registry_->Register(reg).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("kv_blocks_total 0 must be in [1, "));
  for (const char* bad :
       {"not an address", "h", ":1", "h:0", "h:65536", "h:x"}) {
    SCOPED_TRACE(bad);
    reg = Reg(WorkerRole::kDecode, bad);
    EXPECT_THAT(registry_->Register(reg).status().message(),
                HasSubstr("must be HOST:PORT"));
  }
  reg = Reg(WorkerRole::kDecode, "[::1]:50051");
  ASSERT_TRUE(registry_->Register(reg).ok());
  reg = Reg(WorkerRole::kDecode, "h:1", kMaxLoadCount + 1);
  EXPECT_EQ(registry_->Register(reg).status().code(),
            absl::StatusCode::kInvalidArgument);
  reg = Reg(WorkerRole::kDecode, "h:1");
  reg.kv_layout.head_dim = 0;
  EXPECT_EQ(registry_->Register(reg).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_->List().size(), 1u);  // the IPv6 one
}

TEST_F(WorkerRegistryTest, HeartbeatRecordsLoadAndLeases) {
  WorkerRef w = *registry_->Register(Reg(WorkerRole::kDecode, "h:1", 100));
  WorkerLoad load{.queued_prefill_tokens = 7,
                  .running_sequences = 3,
                  .kv_blocks_free = 60,
                  .kv_blocks_total = 100,
                  .kv_blocks_reserved = 10};
  ASSERT_TRUE(registry_->Heartbeat(w, load, {"r1", "r2"}).ok());
  WorkerInfo info = *registry_->Get(w.id);
  EXPECT_EQ(info.load, load);
  EXPECT_THAT(info.leased_request_ids, ElementsAre("r1", "r2"));
  // Routing's copy: everything but the leases.
  const std::vector<WorkerInfo> routing = registry_->ListWithoutLeases();
  ASSERT_EQ(routing.size(), 1u);
  EXPECT_EQ(routing[0].ref, w);
  EXPECT_EQ(routing[0].load, load);
  EXPECT_EQ(routing[0].registration.address, info.registration.address);
  EXPECT_EQ(routing[0].health, info.health);
  EXPECT_EQ(routing[0].last_heartbeat, info.last_heartbeat);
  EXPECT_THAT(routing[0].leased_request_ids, IsEmpty());
}

TEST_F(WorkerRegistryTest, HeartbeatErrors) {
  WorkerRef w = *registry_->Register(Reg(WorkerRole::kDecode, "h:1", 100));
  WorkerLoad ok_load{.kv_blocks_free = 100, .kv_blocks_total = 100};
  EXPECT_EQ(registry_->Heartbeat({"w9", 1}, ok_load, {}).code(),
            absl::StatusCode::kNotFound);
  absl::Status stale = registry_->Heartbeat({w.id, w.epoch + 5}, ok_load, {});
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(stale.message(), HasSubstr("stale"));
  WorkerLoad over{
      .kv_blocks_free = 90, .kv_blocks_total = 100, .kv_blocks_reserved = 20};
  absl::Status s = registry_->Heartbeat(w, over, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("kv_blocks_reserved 20 exceeds"));
  WorkerLoad wrong_total{.kv_blocks_free = 10, .kv_blocks_total = 50};
  EXPECT_THAT(registry_->Heartbeat(w, wrong_total, {}).message(),
              HasSubstr("differs from the registered 100"));
  WorkerLoad negative{.queued_prefill_tokens = -1, .kv_blocks_total = 100};
  EXPECT_EQ(registry_->Heartbeat(w, negative, {}).code(),
            absl::StatusCode::kInvalidArgument);
  // Counts near int64's end would overflow routing's sums (a worker
  // reporting INT64_MAX queued tokens looked the least loaded).
  WorkerLoad huge{.queued_prefill_tokens = INT64_MAX, .kv_blocks_total = 100};
  absl::Status too_big = registry_->Heartbeat(w, huge, {});
  EXPECT_EQ(too_big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_big.message(), HasSubstr("out of range"));
  WorkerLoad nan_rate{.kv_blocks_total = 100,
                      .prefill_tokens_per_second = std::nan("")};
  EXPECT_EQ(registry_->Heartbeat(w, nan_rate, {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_->Get(w.id)->load.queued_prefill_tokens, 0);
}

TEST_F(WorkerRegistryTest, MissedHeartbeatsMakeSuspectThenDown) {
  WorkerRef w = *registry_->Register(Reg(WorkerRole::kDecode, "h:1", 100));
  WorkerLoad load{.kv_blocks_free = 90, .kv_blocks_total = 100};
  ASSERT_TRUE(registry_->Heartbeat(w, load, {"r1"}).ok());

  clock_.Advance(absl::Seconds(2));  // exactly suspect_after: still healthy
  EXPECT_THAT(registry_->Tick(), IsEmpty());
  EXPECT_EQ(Health(w), WorkerHealth::kHealthy);

  clock_.Advance(absl::Milliseconds(1));
  EXPECT_THAT(registry_->Tick(), IsEmpty());
  EXPECT_EQ(Health(w), WorkerHealth::kSuspect);

  // A heartbeat brings it back.
  ASSERT_TRUE(registry_->Heartbeat(w, load, {"r1"}).ok());
  EXPECT_EQ(Health(w), WorkerHealth::kHealthy);

  clock_.Advance(absl::Seconds(5));
  EXPECT_THAT(registry_->Tick(), IsEmpty());
  EXPECT_EQ(Health(w), WorkerHealth::kSuspect);
  clock_.Advance(absl::Milliseconds(1));
  std::vector<DownEvent> down = registry_->Tick();
  ASSERT_EQ(down.size(), 1u);
  EXPECT_EQ(down[0].worker, w);
  EXPECT_THAT(down[0].reason, HasSubstr("lease expired"));
  EXPECT_THAT(down[0].last_leased_request_ids, ElementsAre("r1"));
  EXPECT_EQ(Health(w), WorkerHealth::kDown);
  // Reported once only.
  clock_.Advance(absl::Seconds(60));
  EXPECT_THAT(registry_->Tick(), IsEmpty());
  // A late heartbeat is refused: the worker must drop leases and re-register.
  absl::Status late = registry_->Heartbeat(w, load, {"r1"});
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.message(), HasSubstr("register again"));
}

// Every worker silent at once points at the coordinator (or its host or
// network), not at every worker dying: they stay SUSPECT for the disruption
// TTL (3 lease TTLs by default); once one is heard from again the others
// get a full lease TTL from the disruption's end, and then the normal rule.
TEST_F(WorkerRegistryTest, EveryWorkerSilentAtOnceIsADisruptionNotDeaths) {
  WorkerRef a = *registry_->Register(Reg(WorkerRole::kPrefill, "h:1", 100));
  WorkerRef b = *registry_->Register(Reg(WorkerRole::kDecode, "h:2", 100));
  WorkerRef c = *registry_->Register(Reg(WorkerRole::kDecode, "h:3", 100));
  clock_.Advance(absl::Seconds(5) + absl::Milliseconds(1));
  EXPECT_THAT(registry_->Tick(), IsEmpty());
  for (const WorkerRef& w : {a, b, c}) {
    EXPECT_EQ(Health(w), WorkerHealth::kSuspect) << w;
  }
  clock_.Advance(absl::Seconds(5));
  EXPECT_THAT(registry_->Tick(), IsEmpty());
  // The coordinator hears from a and b again; c stays silent: it is DOWN a
  // lease TTL after the disruption ended, not at once.
  const WorkerLoad load{.kv_blocks_free = 100, .kv_blocks_total = 100};
  ASSERT_TRUE(registry_->Heartbeat(a, load, {}).ok());
  ASSERT_TRUE(registry_->Heartbeat(b, load, {}).ok());
  EXPECT_EQ(Health(a), WorkerHealth::kHealthy);
  EXPECT_THAT(registry_->Tick(), IsEmpty());
  EXPECT_EQ(Health(c), WorkerHealth::kSuspect);
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(registry_->Heartbeat(a, load, {}).ok());
  ASSERT_TRUE(registry_->Heartbeat(b, load, {}).ok());
  EXPECT_THAT(registry_->Tick(), IsEmpty());
  clock_.Advance(absl::Seconds(1) + absl::Milliseconds(1));
  ASSERT_TRUE(registry_->Heartbeat(a, load, {}).ok());
  ASSERT_TRUE(registry_->Heartbeat(b, load, {}).ok());
  std::vector<DownEvent> down = registry_->Tick();
  ASSERT_EQ(down.size(), 1u);
  EXPECT_EQ(down[0].worker, c);
}

TEST_F(WorkerRegistryTest, ADisruptionLastsAtMostItsTtl) {
  WorkerRef a = *registry_->Register(Reg(WorkerRole::kPrefill, "h:1", 100));
  WorkerRef b = *registry_->Register(Reg(WorkerRole::kDecode, "h:2", 100));
  clock_.Advance(absl::Seconds(15));
  EXPECT_THAT(registry_->Tick(), IsEmpty());
  clock_.Advance(absl::Milliseconds(1));
  std::vector<DownEvent> down = registry_->Tick();
  ASSERT_EQ(down.size(), 2u);
  EXPECT_THAT(down[0].reason, HasSubstr("disruption TTL"));
  EXPECT_EQ(Health(a), WorkerHealth::kDown);
  EXPECT_EQ(Health(b), WorkerHealth::kDown);
}

// Hysteresis: a worker whose heartbeats are late but whose streams still
// deliver data stays SUSPECT (nothing new is routed to it) instead of going
// DOWN and failing those streams; with neither for a lease TTL it is DOWN.
TEST_F(WorkerRegistryTest, StreamActivityKeepsALateWorkerSuspectNotDown) {
  WorkerRef w = *registry_->Register(Reg(WorkerRole::kDecode, "h:1", 100));
  WorkerLoad load{.kv_blocks_free = 90, .kv_blocks_total = 100};
  ASSERT_TRUE(registry_->Heartbeat(w, load, {"r1"}).ok());
  // 12 s without a heartbeat (more than two lease TTLs), data every second.
  for (int s = 0; s < 12; ++s) {
    clock_.Advance(absl::Seconds(1));
    registry_->RecordActivity(w);
    EXPECT_THAT(registry_->Tick(), IsEmpty()) << "after " << s + 1 << " s";
  }
  EXPECT_EQ(Health(w), WorkerHealth::kSuspect);
  // A heartbeat makes it HEALTHY again.
  ASSERT_TRUE(registry_->Heartbeat(w, load, {"r1"}).ok());
  EXPECT_EQ(Health(w), WorkerHealth::kHealthy);
  // Data for a while, then silence: DOWN a lease TTL after the last sign.
  clock_.Advance(absl::Seconds(3));
  registry_->RecordActivity(w);
  clock_.Advance(absl::Seconds(5));
  EXPECT_THAT(registry_->Tick(), IsEmpty());
  clock_.Advance(absl::Milliseconds(1));
  std::vector<DownEvent> down = registry_->Tick();
  ASSERT_EQ(down.size(), 1u);
  EXPECT_THAT(down[0].reason, HasSubstr("no stream data for 5.001s"));
  // Activity after DOWN changes nothing; nor does a stale epoch's.
  registry_->RecordActivity(w);
  EXPECT_EQ(Health(w), WorkerHealth::kDown);
}

TEST_F(WorkerRegistryTest, LateHeartbeatBeforeTickIsRefusedAndReported) {
  WorkerRef w = *registry_->Register(Reg(WorkerRole::kPrefill, "h:1", 0));
  clock_.Advance(absl::Seconds(6));
  EXPECT_EQ(registry_->Heartbeat(w, WorkerLoad{}, {}).code(),
            absl::StatusCode::kFailedPrecondition);
  std::vector<DownEvent> down = registry_->Tick();
  ASSERT_EQ(down.size(), 1u);
  EXPECT_EQ(down[0].worker, w);
}

TEST_F(WorkerRegistryTest, ReRegistrationBumpsEpochAndReportsOldIncarnation) {
  WorkerRef old = *registry_->Register(Reg(WorkerRole::kDecode, "h:1", 100));
  WorkerRef other = *registry_->Register(Reg(WorkerRole::kDecode, "h:2", 100));
  ASSERT_TRUE(registry_
                  ->Heartbeat(old,
                              {.kv_blocks_free = 80, .kv_blocks_total = 100},
                              {"r7"})
                  .ok());
  WorkerRef fresh = *registry_->Register(Reg(WorkerRole::kDecode, "h:1", 100));
  EXPECT_EQ(fresh.id, old.id);
  EXPECT_GT(fresh.epoch, other.epoch);
  std::vector<DownEvent> down = registry_->Tick();
  ASSERT_EQ(down.size(), 1u);
  EXPECT_EQ(down[0].worker, old);
  EXPECT_THAT(down[0].reason, HasSubstr("re-registered as epoch 3"));
  EXPECT_THAT(down[0].last_leased_request_ids, ElementsAre("r7"));
  EXPECT_EQ(Health(fresh), WorkerHealth::kHealthy);
  EXPECT_EQ(registry_->Get(fresh.id)->load.kv_blocks_free, 100);
  EXPECT_EQ(registry_->Heartbeat(old, {.kv_blocks_total = 100}, {}).code(),
            absl::StatusCode::kFailedPrecondition);
  // Re-registering after the old one already went DOWN reports nothing new.
  // (Both silent at once: DOWN after the disruption TTL, 3 lease TTLs.)
  clock_.Advance(absl::Seconds(16));
  down = registry_->Tick();
  ASSERT_EQ(down.size(), 2u);  // fresh and other expired
  EXPECT_EQ(down[0].worker, fresh);
  EXPECT_EQ(down[1].worker, other);
  WorkerRef third = *registry_->Register(Reg(WorkerRole::kDecode, "h:1", 100));
  EXPECT_EQ(third.id, old.id);
  EXPECT_THAT(registry_->Tick(), IsEmpty());
}

TEST_F(WorkerRegistryTest, DrainAndRemove) {
  WorkerRef w = *registry_->Register(Reg(WorkerRole::kBoth, "h:1", 100));
  ASSERT_TRUE(registry_->Drain(w).ok());
  EXPECT_EQ(Health(w), WorkerHealth::kDraining);
  // Still heartbeats while draining, and stays draining.
  ASSERT_TRUE(
      registry_
          ->Heartbeat(w, {.kv_blocks_free = 100, .kv_blocks_total = 100}, {})
          .ok());
  clock_.Advance(absl::Seconds(3));
  registry_->Tick();
  EXPECT_EQ(Health(w), WorkerHealth::kDraining);
  ASSERT_TRUE(registry_->Remove(w, "drained").ok());
  std::vector<DownEvent> down = registry_->Tick();
  ASSERT_EQ(down.size(), 1u);
  EXPECT_EQ(down[0].reason, "drained");
  EXPECT_EQ(registry_->Remove(w, "again").code(),
            absl::StatusCode::kFailedPrecondition);
}

WorkerRegistration Named(std::string name, uint64_t incarnation,
                         std::string address) {
  WorkerRegistration reg = Reg(WorkerRole::kDecode, std::move(address));
  reg.worker_id = std::move(name);
  reg.incarnation = incarnation;
  return reg;
}

TEST_F(WorkerRegistryTest, NamedWorkerRestartReplacesItsOldIncarnation) {
  WorkerRef first = *registry_->Register(Named("decode-a", 7, "h:1"));
  EXPECT_EQ(first.id, "decode-a");
  // Restarted: same name and address, new incarnation.
  auto second = registry_->Register(Named("decode-a", 8, "h:1"));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->id, "decode-a");
  EXPECT_GT(second->epoch, first.epoch);
  std::vector<DownEvent> down = registry_->Tick();
  ASSERT_EQ(down.size(), 1u);
  EXPECT_EQ(down[0].worker, first);
  EXPECT_THAT(down[0].reason, HasSubstr("restarted (incarnation 8)"));
  ASSERT_EQ(registry_->List().size(), 1u);
  EXPECT_EQ(registry_->List()[0].registration.incarnation, 8u);
  // The old incarnation's heartbeat is told to register again.
  EXPECT_EQ(registry_->Heartbeat(first, {.kv_blocks_total = 100}, {}).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(WorkerRegistryTest, LiveNameIsRefusedToAnotherWorker) {
  ASSERT_TRUE(registry_->Register(Named("decode-a", 7, "h:1")).ok());
  auto thief = registry_->Register(Named("decode-a", 9, "evil:1"));
  EXPECT_EQ(thief.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(thief.status().message(), HasSubstr("held by a live worker"));
  EXPECT_THAT(registry_->Tick(), IsEmpty());
  // Once the holder's lease has expired the name is free again (a worker
  // restarted on another port registers once its old lease is over).
  clock_.Advance(absl::Seconds(6));
  EXPECT_TRUE(registry_->Register(Named("decode-a", 9, "other:1")).ok());
}

TEST_F(WorkerRegistryTest, AnAddressTakenOverRetiresItsFormerWorker) {
  WorkerRef old = *registry_->Register(Named("decode-a", 7, "h:1"));
  ASSERT_TRUE(registry_->Register(Named("decode-b", 3, "h:1")).ok());
  std::vector<DownEvent> down = registry_->Tick();
  ASSERT_EQ(down.size(), 1u);
  EXPECT_EQ(down[0].worker, old);
  EXPECT_THAT(down[0].reason, HasSubstr("now belongs to worker decode-b"));
}

TEST_F(WorkerRegistryTest, MalformedNamesAndMissingIncarnation) {
  for (const std::string& bad :
       {std::string(65, 'a'), std::string("a b"), std::string("w/1")}) {
    EXPECT_EQ(registry_->Register(Named(bad, 1, "h:1")).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
  auto no_incarnation = registry_->Register(Named("ok", 0, "h:1"));
  EXPECT_THAT(no_incarnation.status().message(), HasSubstr("incarnation"));
}

TEST_F(WorkerRegistryTest, EpochsStartWhereTheOptionsSay) {
  WorkerRegistryOptions options;
  options.first_epoch = 1'000'000;
  auto registry = WorkerRegistry::Create(options, &clock_);
  ASSERT_TRUE(registry.ok());
  EXPECT_EQ((*registry)->Register(Named("a", 1, "h:1"))->epoch, 1'000'000u);
  EXPECT_EQ((*registry)->Register(Named("b", 1, "h:2"))->epoch, 1'000'001u);
}

// A worker that heartbeats on time while its engine makes no step with work
// in it is wedged: DOWN after engine_stall_after, and the same process
// registering again stays SUSPECT until its step count moves.
TEST_F(WorkerRegistryTest, AWedgedEngineGoesDownAndStaysOutUntilItMoves) {
  WorkerRegistryOptions options = registry_->options();
  options.engine_stall_after = absl::Seconds(10);
  auto created = WorkerRegistry::Create(options, &clock_);
  ASSERT_TRUE(created.ok()) << created.status();
  WorkerRegistry& registry = **created;
  const WorkerRef idle = *registry.Register(Named("idle", 1, "h:1"));
  const WorkerRef wedged = *registry.Register(Named("wedged", 2, "h:2"));
  const WorkerLoad nothing{.kv_blocks_total = 100, .engine_steps = 40};
  WorkerLoad busy = nothing;
  busy.running_sequences = 2;
  busy.queued_prefill_tokens = 30;
  // 30 s of on-time heartbeats: the idle worker's count stands still with
  // no work (fine); the busy one's moves for the first 4 s, then stops.
  for (int s = 1; s <= 30; ++s) {
    clock_.Advance(absl::Seconds(1));
    if (s <= 4) ++busy.engine_steps;
    ASSERT_TRUE(registry.Heartbeat(idle, nothing, {}).ok());
    absl::Status beat = registry.Heartbeat(wedged, busy, {"r1", "r2"});
    std::vector<DownEvent> down = registry.Tick();
    if (s <= 14) {
      ASSERT_TRUE(beat.ok()) << "second " << s << ": " << beat;
      ASSERT_THAT(down, IsEmpty()) << "second " << s;
      continue;
    }
    // Last move at 4 s; no step for more than 10 s at 15 s.
    ASSERT_EQ(s, 15);
    ASSERT_EQ(down.size(), 1u);
    EXPECT_EQ(down[0].worker, wedged);
    EXPECT_THAT(down[0].reason, HasSubstr("engine wedged: no step for 11s"));
    EXPECT_THAT(down[0].reason, HasSubstr("2 sequences running"));
    EXPECT_THAT(down[0].last_leased_request_ids, ElementsAre("r1", "r2"));
    break;
  }
  EXPECT_EQ(registry.Get("idle")->health, WorkerHealth::kHealthy);
  // Its next heartbeat is refused; the same process registers again and is
  // kept out of routing while its count stands still.
  EXPECT_EQ(registry.Heartbeat(wedged, busy, {}).code(),
            absl::StatusCode::kFailedPrecondition);
  const WorkerRef again = *registry.Register(Named("wedged", 2, "h:2"));
  EXPECT_EQ(registry.Get("wedged")->health, WorkerHealth::kSuspect);
  for (int s = 0; s < 20; ++s) {
    clock_.Advance(absl::Seconds(1));
    ASSERT_TRUE(registry.Heartbeat(idle, nothing, {}).ok());
    ASSERT_TRUE(registry.Heartbeat(again, busy, {}).ok());
  }
  EXPECT_EQ(registry.Get("wedged")->health, WorkerHealth::kSuspect);
  EXPECT_THAT(registry.Tick(), IsEmpty()) << "one DOWN per wedge";
  // The engine moves again: routable.
  ++busy.engine_steps;
  ASSERT_TRUE(registry.Heartbeat(again, busy, {}).ok());
  EXPECT_EQ(registry.Get("wedged")->health, WorkerHealth::kHealthy);
  // A restarted process (new incarnation) starts clean.
  for (int s = 0; s < 11; ++s) {
    clock_.Advance(absl::Seconds(1));
    ASSERT_TRUE(registry.Heartbeat(idle, nothing, {}).ok());
    // Refused from the 11th second: wedged again.
    (void)registry.Heartbeat(again, busy, {});
  }
  ASSERT_EQ(registry.Tick().size(), 1u);
  const WorkerRef restarted = *registry.Register(Named("wedged", 3, "h:2"));
  EXPECT_EQ(registry.Get("wedged")->health, WorkerHealth::kHealthy);
  EXPECT_EQ(restarted.id, "wedged");
}

TEST_F(WorkerRegistryTest, EngineStallCheckNeedsAPositiveBound) {
  WorkerRegistryOptions options;
  options.engine_stall_after = absl::ZeroDuration();
  EXPECT_THAT(WorkerRegistry::Create(options, &clock_).status().message(),
              HasSubstr("engine_stall_after must be > 0"));
  options.engine_stall_after = absl::InfiniteDuration();
  EXPECT_TRUE(WorkerRegistry::Create(options, &clock_).ok());
}

}  // namespace
}  // namespace baton::coordinator
