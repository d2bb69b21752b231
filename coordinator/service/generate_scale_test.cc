// Thousands of concurrent Generate streams cost the coordinator a few
// threads, not one each: its calls are coroutines on a small executor and
// its worker RPCs use gRPC's callback API. Two minimal fake workers
// (scale_fixture.h) and a client of callback reactors keep 5,000 requests
// in flight inside one process; the test counts the process's threads then,
// and every request still ends with its result.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

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

TEST(GenerateScaleTest, FiveThousandStreamsCostAFewThreads) {
  auto model = ServedModel::Load(testing::DefaultModelPath());
  ASSERT_TRUE(model.ok()) << model.status();
  // Slowness is not what this test is about (a sanitizer build on a busy
  // host reaches 5,000 streams in minutes): no queue or transfer timeout.
  auto cluster =
      Cluster::Create(ScaleOptions(kStreams), std::move(*model), RealClock());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ControlPlaneService control_plane(cluster->get());
  BatonService api(cluster->get());
  auto coordinator = StartServer(
      "127.0.0.1:0", {{&control_plane, v1::Coordinator::service_full_name()},
                      {&api, v1::Baton::service_full_name()}});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  auto channel = grpc::CreateChannel(coordinator->address,
                                     grpc::InsecureChannelCredentials());
  auto baton = v1::Baton::NewStub(channel);
  auto control = v1::Coordinator::NewStub(channel);

  FakeWorker prefill_service;
  FakeWorker decode_service;
  std::vector<RunningServer> workers;
  for (auto [service, role] :
       {std::pair{&prefill_service, v1::WORKER_ROLE_PREFILL},
        std::pair{&decode_service, v1::WORKER_ROLE_DECODE}}) {
    auto running = StartServer("127.0.0.1:0",
                               {{service, v1::Worker::service_full_name()}});
    ASSERT_TRUE(running.ok()) << running.status();
    const absl::Status registered = RegisterFakeWorker(
        *control, running->address, role, (*cluster)->model().id());
    ASSERT_TRUE(registered.ok()) << registered;
    workers.push_back(std::move(*running));
  }

  const int threads_before = ProcessThreads();
  std::vector<std::unique_ptr<ClientStream>> streams;
  streams.reserve(kStreams);
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(std::make_unique<ClientStream>(baton.get()));
  }
  // Every request holds its first token and waits in its Decode stream.
  EXPECT_TRUE(Eventually([&] { return decode_service.held() == kStreams; }))
      << decode_service.held() << " of " << kStreams << " reached Decode";
  const int threads_in_flight = ProcessThreads();
  const int calls = (*cluster)->active_calls();
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
  EXPECT_TRUE(Eventually([&] { return (*cluster)->active_calls() == 0; }));
  scale::StopAll(**cluster, *coordinator, workers);
}

}  // namespace
}  // namespace baton::coordinator
