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
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
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
  auto request_of = [](int i) {
    v1::GenerateRequest request = LongRequest(i, kTokens);
    if (i % 2 == 0) request.mutable_sampling()->set_temperature(0);
    return request;
  };
  // Every request holds its first token (the prefill worker's) before the
  // second decode worker starts: each is then bound to the victim, the only
  // decode worker it could reserve on.
  std::vector<StreamResult> results(kRequests);
  std::vector<absl::Notification> first_token(kRequests);
  std::vector<std::thread> clients;
  for (int i = 0; i < kRequests; ++i) {
    clients.emplace_back([&, i] {
      StreamOptions stream;
      stream.on_message = [&, i](const StreamResult& so_far) {
        if (!so_far.tokens.empty() &&
            !first_token[static_cast<size_t>(i)].HasBeenNotified()) {
          first_token[static_cast<size_t>(i)].Notify();
        }
      };
      results[static_cast<size_t>(i)] =
          RunGenerate(cluster->baton(), request_of(i), stream);
      if (!first_token[static_cast<size_t>(i)].HasBeenNotified()) {
        first_token[static_cast<size_t>(i)].Notify();  // it ended early
      }
    });
  }
  for (absl::Notification& n : first_token) n.WaitForNotification();
  const absl::StatusOr<int> joined = cluster->AddWorker("decode");
  EXPECT_TRUE(joined.ok()) << joined.status();
  for (std::thread& t : clients) t.join();
  ASSERT_TRUE(joined.ok());
  for (int i = 0; i < kRequests; ++i) {
    const StreamResult& r = results[static_cast<size_t>(i)];
    ASSERT_TRUE(r.status.ok() && r.has_result) << i << ": " << Describe(r);
    EXPECT_EQ(r.result.finish_reason(), v1::FINISH_REASON_LENGTH)
        << i << ": " << Describe(r);
    EXPECT_EQ(r.tokens.size(), static_cast<size_t>(kTokens)) << i;
    EXPECT_EQ(r.result.migrations(), 1) << i;
    EXPECT_EQ(r.result.decode_worker().address(),
              cluster->workers()[*joined].address)
        << i;
  }
  // The wedged process still heartbeats, registered again, and gets nothing
  // new: SUSPECT while its step count stands still.
  EXPECT_EQ(HealthAtCoordinator(*cluster, cluster->workers()[victim].address),
            v1::WORKER_HEALTH_SUSPECT);
  // The fault-free run of each request lands on the healthy decode worker.
  std::vector<StreamResult> again(kRequests);
  std::vector<std::thread> reruns;
  for (int i = 0; i < kRequests; ++i) {
    reruns.emplace_back([&, i] {
      again[static_cast<size_t>(i)] =
          RunGenerate(cluster->baton(), request_of(i));
    });
  }
  for (std::thread& t : reruns) t.join();
  for (int i = 0; i < kRequests; ++i) {
    const StreamResult& fault_free = again[static_cast<size_t>(i)];
    const StreamResult& moved = results[static_cast<size_t>(i)];
    ASSERT_TRUE(fault_free.status.ok() && fault_free.has_result)
        << Describe(fault_free);
    EXPECT_EQ(fault_free.result.migrations(), 0);
    EXPECT_EQ(fault_free.result.decode_worker().address(),
              cluster->workers()[*joined].address);
    EXPECT_EQ(moved.tokens, fault_free.tokens) << "request " << i;
    EXPECT_EQ(moved.text, fault_free.text) << "request " << i;
  }
  // Only a signal ends the wedged process; the others hold nothing and stop
  // cleanly.
  cluster->Kill(victim);
  ExpectAllFree(*cluster);
  ExpectCleanStop(*cluster);
}

}  // namespace
}  // namespace baton::testing
