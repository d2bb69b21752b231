// SIGTERM drains a worker (--drain_timeout_s): its health turns NOT_SERVING
// at once, the coordinator marks it DRAINING and routes nothing new to it,
// the requests it holds finish with the tokens a run without the signal
// gives, and then it exits 0. The signal comes at a known point: the prefill
// worker stops itself in its first prefill step (fault point prefill_step)
// while the decode worker holds the request's KV reservation, so the decode
// worker's drain cannot end before the test lets the prefill go on.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/cluster/cluster_fault_util.h"
#include "tests/cluster/cluster_test_util.h"
#include "tests/cluster/local_cluster.h"

namespace baton::testing {
namespace {

// A guard against a hang, never a bound the test measures.
absl::Duration Guard() { return absl::Seconds(120) + 100 * HostPace(); }

LocalClusterOptions DrainingCluster() {
  LocalClusterOptions options;
  // The prefill worker stops itself mid-prefill; a lease longer than any
  // test keeps the coordinator from taking it for dead meanwhile.
  options.lease_ttl_ms = 3600 * 1000;
  options.flags_of_worker[0] = {"--fault=prefill_step:stop"};
  options.drain_timeout_s = 3600;
  return options;
}

v1::WorkerHealth HealthAtCoordinator(LocalCluster& cluster,
                                     const std::string& address) {
  v1::GetClusterStatusResponse status;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  if (!cluster.baton().GetClusterStatus(&context, {}, &status).ok()) {
    return v1::WORKER_HEALTH_UNSPECIFIED;
  }
  for (const v1::WorkerStatus& w : status.workers()) {
    if (w.worker().address() == address) return w.health();
  }
  return v1::WORKER_HEALTH_UNSPECIFIED;
}

grpc::health::v1::HealthCheckResponse::ServingStatus OwnHealth(
    const std::string& address) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  grpc::health::v1::HealthCheckResponse response;
  if (!stub->Check(&context, {}, &response).ok()) {
    return grpc::health::v1::HealthCheckResponse::UNKNOWN;
  }
  return response.status();
}

// Polls `done` every 10 ms until it holds or Guard() runs out.
template <typename F>
bool Eventually(F done) {
  const absl::Time deadline = absl::Now() + Guard();
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

void ExpectExitsZero(LocalCluster::Worker& worker) {
  const absl::StatusOr<int> status = worker.process->Wait(Guard());
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << "wait status " << *status;
}

TEST(ClusterDrainTest, DecodeWorkerDrainsItsReservedRequest) {
  auto cluster = StartOrDie(DrainingCluster());
  ASSERT_NE(cluster, nullptr);
  LocalCluster::Worker& decode = cluster->workers()[1];
  ASSERT_EQ(decode.role, "decode");
  const v1::GenerateRequest request = LongRequest(0, 24);
  const std::vector<Expected> expected = InProcessReference({request});

  StreamResult result;
  std::thread client([&] { result = RunGenerate(cluster->baton(), request); });
  // The prefill worker holds the prompt; the decode worker its reservation.
  const absl::StatusOr<int> stopped = cluster->WaitForStoppedWorker(Guard());
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  ASSERT_EQ(*stopped, 0);

  decode.process->Signal(SIGTERM);
  EXPECT_TRUE(Eventually([&] {
    return OwnHealth(decode.address) ==
           grpc::health::v1::HealthCheckResponse::NOT_SERVING;
  })) << "the draining worker's health stayed SERVING";
  EXPECT_TRUE(Eventually([&] {
    return HealthAtCoordinator(*cluster, decode.address) ==
           v1::WORKER_HEALTH_DRAINING;
  })) << "the coordinator did not mark the worker DRAINING";
  // The reservation still holds it: no exit while its request is in flight.
  EXPECT_TRUE(decode.process->running());

  cluster->workers()[0].process->Signal(SIGCONT);
  client.join();
  ASSERT_TRUE(result.status.ok()) << Describe(result);
  ASSERT_TRUE(result.has_result) << Describe(result);
  EXPECT_EQ(result.tokens, expected[0].tokens);
  EXPECT_EQ(result.text, expected[0].text);
  EXPECT_EQ(result.result.decode_worker().address(), decode.address);
  ExpectExitsZero(decode);
  // Removed once it deregistered after the drain.
  EXPECT_TRUE(Eventually([&] {
    const v1::WorkerHealth h = HealthAtCoordinator(*cluster, decode.address);
    return h != v1::WORKER_HEALTH_DRAINING && h != v1::WORKER_HEALTH_HEALTHY;
  }));
  ExpectCleanStop(*cluster);
}

TEST(ClusterDrainTest, PrefillWorkerFinishesItsPrefillBeforeExiting) {
  auto cluster = StartOrDie(DrainingCluster());
  ASSERT_NE(cluster, nullptr);
  LocalCluster::Worker& prefill = cluster->workers()[0];
  const v1::GenerateRequest request = LongRequest(1, 16);
  const std::vector<Expected> expected = InProcessReference({request});

  StreamResult result;
  std::thread client([&] { result = RunGenerate(cluster->baton(), request); });
  const absl::StatusOr<int> stopped = cluster->WaitForStoppedWorker(Guard());
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  ASSERT_EQ(*stopped, 0);
  // Signalled mid-prefill: the prefill, its handoff and the request finish.
  prefill.process->Signal(SIGTERM);
  prefill.process->Signal(SIGCONT);
  client.join();
  ASSERT_TRUE(result.status.ok()) << Describe(result);
  ASSERT_TRUE(result.has_result) << Describe(result);
  EXPECT_EQ(result.tokens, expected[0].tokens);
  EXPECT_EQ(result.text, expected[0].text);
  ExpectExitsZero(prefill);
  ExpectAllFree(*cluster);
  ExpectCleanStop(*cluster);
}

}  // namespace
}  // namespace baton::testing
