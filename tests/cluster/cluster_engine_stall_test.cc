// A decode worker whose engine wedges (--fault=decode_step:hang: the engine
// thread blocks for good while the process, its heartbeats included, goes
// on) must not hold its requests forever. Its heartbeats show running
// sequences and a step count that stands still, so the coordinator marks it
// DOWN after --engine_stall_timeout_ms; its requests migrate to a healthy
// decode worker and complete with the output a fault-free run gives; the
// wedged process registers again and stays SUSPECT, so nothing new is
// routed to it.
#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/cluster/cluster_fault_util.h"
#include "tests/cluster/cluster_test_util.h"
#include "tests/cluster/local_cluster.h"

namespace baton::testing {
namespace {

TEST(ClusterEngineStallTest, WedgedDecodeEngineIsTakenOutAndItsRequestsMove) {
  // A step of this cluster's decode worker is well under one HostPace (a
  // 32-token prefill and 4 decode steps); a wedge is declared only after
  // many paces without one.
  const absl::Duration stall = absl::Seconds(3) + 20 * HostPace();
  LocalClusterOptions options;
  options.coordinator_flags.push_back(absl::StrCat(
      "--engine_stall_timeout_ms=", absl::ToInt64Milliseconds(stall)));
  const int victim = 1;
  // Its third decode step never ends.
  options.flags_of_worker[victim] = {"--fault=decode_step:hang@3"};
  auto cluster = StartOrDie(options);
  ASSERT_NE(cluster, nullptr);
  ASSERT_EQ(cluster->workers()[victim].role, "decode");
  constexpr int kRequests = 4;
  constexpr int kTokens = 40;
  const std::vector<v1::GenerateRequest> requests =
      MixedLongRequests(kRequests, kTokens);
  // Every request holds its first token (the prefill worker's) before the
  // second decode worker starts: each is then bound to the victim, the only
  // decode worker it could reserve on.
  StreamsUnderway streams(cluster->baton(), requests, /*min_tokens=*/1,
                          /*staggered=*/false);
  const absl::StatusOr<int> joined = cluster->AddWorker("decode");
  EXPECT_TRUE(joined.ok()) << joined.status();
  streams.Join();
  ASSERT_TRUE(joined.ok());
  const std::vector<StreamResult>& results = streams.results();
  ExpectMigratedOnceTo(results, kTokens, cluster->workers()[*joined].address);
  // The wedged process still heartbeats, registered again, and gets nothing
  // new: SUSPECT while its step count stands still.
  EXPECT_EQ(HealthAtCoordinator(*cluster, cluster->workers()[victim].address),
            v1::WORKER_HEALTH_SUSPECT);
  // The fault-free run of each request lands on the healthy decode worker.
  const std::vector<StreamResult> again =
      RunConcurrently(cluster->baton(), requests);
  for (const StreamResult& r : again) {
    EXPECT_EQ(r.result.decode_worker().address(),
              cluster->workers()[*joined].address);
  }
  ExpectSameOutputs(results, again);
  // Only a signal ends the wedged process; the others hold nothing and stop
  // cleanly.
  cluster->Kill(victim);
  ExpectAllFree(*cluster);
  ExpectCleanStop(*cluster);
}

}  // namespace
}  // namespace baton::testing
