// Thousands of concurrent Generate streams cost the coordinator a few
// threads, not one each: its calls are coroutines on a small executor and
// its worker RPCs use gRPC's callback API. Two minimal fake workers
// (scale_fixture.h) and a client of callback reactors keep 5,000 requests
// in flight inside one process; the test counts the process's threads then,
// and every request still ends with its result. The same fakes show which
// requests reserve beside their Prefill, and that one sent to wait for room
// does not overtake an earlier grant.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "baton/v1/api.grpc.pb.h"
#include "baton/v1/worker.grpc.pb.h"
#include "common/grpc/serving.h"
#include "common/test_util.h"
#include "coordinator/service/cluster.h"
#include "coordinator/service/coordinator_services.h"
#include "coordinator/service/scale_fixture.h"
#include "gtest/gtest.h"

namespace baton::coordinator {
namespace {

using scale::ClientStream;
using scale::Eventually;
using scale::FakeWorker;
using scale::ProcessThreads;
using scale::RegisterFakeWorker;
using scale::ScaleOptions;

constexpr int kStreams = 5000;
// The threads the whole test process may hold with every stream in flight:
// gRPC's pools for four servers' and clients' completion queues, the
// coordinator's executor and sweeper, and the test's own.
constexpr int kMaxThreads = 64;

// A coordinator in this process and two fake workers, a prefill and a
// decode one, registered with it.
struct FakeCluster {
  std::unique_ptr<Cluster> cluster;
  std::unique_ptr<ControlPlaneService> control_plane;
  std::unique_ptr<BatonService> api;
  std::optional<RunningServer> coordinator;
  std::unique_ptr<v1::Baton::Stub> baton;
  FakeWorker prefill_service;
  FakeWorker decode_service;
  std::vector<RunningServer> workers;

  // `decode_kv_device`: the decode worker's KV is on that device, of
  // `decode_kv_blocks` blocks.
  static std::unique_ptr<FakeCluster> Start(
      const ClusterOptions& options, const std::string& decode_kv_device = "",
      int64_t decode_kv_blocks = int64_t{1} << 24) {
    auto model = ServedModel::Load(testing::DefaultModelPath());
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return nullptr;
    auto out = std::make_unique<FakeCluster>();
    auto cluster = Cluster::Create(options, std::move(*model), RealClock());
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    if (!cluster.ok()) return nullptr;
    out->cluster = std::move(*cluster);
    out->control_plane =
        std::make_unique<ControlPlaneService>(out->cluster.get());
    out->api = std::make_unique<BatonService>(out->cluster.get());
    auto coordinator = StartServer(
        "127.0.0.1:0",
        {{out->control_plane.get(), v1::Coordinator::service_full_name()},
         {out->api.get(), v1::Baton::service_full_name()}});
    EXPECT_TRUE(coordinator.ok()) << coordinator.status();
    if (!coordinator.ok()) return nullptr;
    out->coordinator = std::move(*coordinator);
    auto channel = grpc::CreateChannel(out->coordinator->address,
                                       grpc::InsecureChannelCredentials());
    out->baton = v1::Baton::NewStub(channel);
    auto control = v1::Coordinator::NewStub(channel);
    for (auto [service, role] :
         {std::pair{&out->prefill_service, v1::WORKER_ROLE_PREFILL},
          std::pair{&out->decode_service, v1::WORKER_ROLE_DECODE}}) {
      auto running = StartServer("127.0.0.1:0",
                                 {{service, v1::Worker::service_full_name()}});
      EXPECT_TRUE(running.ok()) << running.status();
      if (!running.ok()) return nullptr;
      const absl::Status registered = RegisterFakeWorker(
          *control, running->address, role, out->cluster->model().id(),
          role == v1::WORKER_ROLE_DECODE ? decode_kv_device : "",
          role == v1::WORKER_ROLE_DECODE ? decode_kv_blocks : int64_t{1} << 24);
      EXPECT_TRUE(registered.ok()) << registered;
      if (!registered.ok()) return nullptr;
      out->workers.push_back(std::move(*running));
    }
    return out;
  }

  ~FakeCluster() {
    if (coordinator.has_value())
      scale::StopAll(*cluster, *coordinator, workers);
  }
};

TEST(GenerateScaleTest, FiveThousandStreamsCostAFewThreads) {
  // Slowness is not what this test is about (a sanitizer build on a busy
  // host reaches 5,000 streams in minutes): no queue or transfer timeout.
  auto fake = FakeCluster::Start(ScaleOptions(kStreams));
  ASSERT_NE(fake, nullptr);
  Cluster* cluster = fake->cluster.get();
  v1::Baton::Stub* baton = fake->baton.get();
  FakeWorker& decode_service = fake->decode_service;

  const int threads_before = ProcessThreads();
  std::vector<std::unique_ptr<ClientStream>> streams;
  streams.reserve(kStreams);
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(std::make_unique<ClientStream>(baton));
  }
  // Every request holds its first token and waits in its Decode stream.
  EXPECT_TRUE(Eventually([&] { return decode_service.held() == kStreams; }))
      << decode_service.held() << " of " << kStreams << " reached Decode";
  const int threads_in_flight = ProcessThreads();
  const int calls = cluster->active_calls();
  std::printf(
      "%d streams in flight (%d coordinator calls): %d threads in the process "
      "(%d before the first request)\n",
      kStreams, calls, threads_in_flight, threads_before);
  EXPECT_EQ(calls, kStreams);
  EXPECT_LE(threads_in_flight, kMaxThreads);

  decode_service.ReleaseAll();
  EXPECT_TRUE(Eventually([&] {
    for (const auto& s : streams) {
      if (!s->done()) return false;
    }
    return true;
  }));
  int finished = 0;
  for (const auto& s : streams) {
    if (s->Outcome() == "FINISH_REASON_LENGTH") {
      ++finished;
    } else if (finished < 3) {
      ADD_FAILURE() << s->Outcome();
    }
  }
  EXPECT_EQ(finished, kStreams);
  streams.clear();
  EXPECT_TRUE(Eventually([&] { return cluster->active_calls() == 0; }));
}

// By default the decode worker's reservation is made beside the Prefill
// (the Prefill carries kv_target_follows, SetKvTarget follows), unless the
// decode worker's KV is on a device (its device-direct transports are named
// by the reservation, which the prefill worker needs before it starts) or
// the coordinator was told to reserve first.
TEST(GenerateRouteTest, TheReservationGoesBesideThePrefillForAHostKvPool) {
  struct Case {
    const char* name;
    bool overlap;
    const char* decode_kv_device;
    bool beside;
  };
  for (const Case& c : {Case{"host KV", true, "", true},
                        Case{"device KV", true, "host/gpu-0", false},
                        Case{"reserve first", false, "", false}}) {
    SCOPED_TRACE(c.name);
    ClusterOptions options = ScaleOptions(1);
    options.overlap_reserve_kv = c.overlap;
    auto fake = FakeCluster::Start(options, c.decode_kv_device);
    ASSERT_NE(fake, nullptr);
    ClientStream stream(fake->baton.get());
    ASSERT_TRUE(Eventually([&] { return fake->decode_service.held() == 1; }));
    fake->decode_service.ReleaseAll();
    ASSERT_TRUE(Eventually([&] { return stream.done(); }));
    EXPECT_EQ(stream.Outcome(), "FINISH_REASON_LENGTH");
    EXPECT_EQ(stream.result().timings().reserve_kv_beside_prefill(), c.beside);
    EXPECT_EQ(fake->prefill_service.prefills_followed(), c.beside ? 1 : 0);
    EXPECT_EQ(fake->prefill_service.prefills_with_target(), c.beside ? 0 : 1);
  }
}

// The Prefill and the reservation carry when the request reached the
// coordinator, on the clock workers compare (they admit prompts, and serve
// reservations waiting for room, in that order).
TEST(GenerateRouteTest, ThePrefillCarriesTheRequestsArrival) {
  auto fake = FakeCluster::Start(ScaleOptions(1));
  ASSERT_NE(fake, nullptr);
  const int64_t before = absl::ToUnixMicros(absl::Now());
  ClientStream stream(fake->baton.get());
  ASSERT_TRUE(Eventually([&] { return fake->decode_service.held() == 1; }));
  const int64_t after = absl::ToUnixMicros(absl::Now());
  fake->decode_service.ReleaseAll();
  ASSERT_TRUE(Eventually([&] { return stream.done(); }));
  const std::vector<int64_t> arrivals = fake->prefill_service.arrivals();
  ASSERT_EQ(arrivals.size(), 1u);
  EXPECT_GE(arrivals[0], before);
  EXPECT_LE(arrivals[0], after);
  EXPECT_EQ(fake->decode_service.reserve_arrivals(), arrivals);
}

// A request that finds no room is sent to wait in the decode worker's line
// only once every reservation granted before it has been answered: the
// worker serves whichever reaches it first, and a grant still on its way
// (its coordinator thread descheduled, its call slow) would otherwise find
// its room taken by the request sent after it.
TEST(GenerateRouteTest, ARequestSentToWaitDoesNotOvertakeAnEarlierGrant) {
  // Room for one request: the second finds none.
  auto fake = FakeCluster::Start(ScaleOptions(2), "", /*decode_kv_blocks=*/1);
  ASSERT_NE(fake, nullptr);
  FakeWorker& decode = fake->decode_service;
  decode.HoldGrants();
  absl::Cleanup answer = [&] { decode.AnswerHeld(); };
  ClientStream first(fake->baton.get());
  ASSERT_TRUE(
      Eventually([&] { return decode.reserve_queue_ms().size() == 1; }));
  ClientStream second(fake->baton.get());
  // Long enough for the second to be sent many times over (the coordinator
  // looks again every millisecond); it must not be while the first's
  // reservation is unanswered.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(decode.reserve_queue_ms().size(), 1u);
  decode.AnswerHeld();
  ASSERT_TRUE(Eventually([&] { return decode.held() == 2; }));
  const std::vector<double> queue_ms = decode.reserve_queue_ms();
  ASSERT_EQ(queue_ms.size(), 2u);
  EXPECT_EQ(queue_ms[0], 0);  // granted
  EXPECT_GT(queue_ms[1], 0);  // sent to wait
  decode.ReleaseAll();
  ASSERT_TRUE(Eventually([&] { return first.done() && second.done(); }));
  EXPECT_EQ(first.Outcome(), "FINISH_REASON_LENGTH");
  EXPECT_EQ(second.Outcome(), "FINISH_REASON_LENGTH");
}

}  // namespace
}  // namespace baton::coordinator
