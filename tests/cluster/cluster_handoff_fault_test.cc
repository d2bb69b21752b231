// A worker killed at each step of a KV handoff, on real processes, at a
// point a fault point names (the worker stops itself there; the test
// SIGKILLs it): the prefill worker after its first layer left and after its
// last; the decode worker after it reserved the blocks (before its reply),
// once the transfer reached it (before any layer was written) and with half
// the layers written. The request goes on without the dead worker (a retry
// or a migration, as the coordinator's state machine decides) and its
// answer is the one a fault-free run gives; the survivors hold no block.
// And a layer whose bytes arrive corrupted: the transfer fails with
// DATA_LOSS and the request is computed and moved again, with the same
// answer.
#include <signal.h>

#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/cluster/cluster_fault_util.h"
#include "tests/cluster/cluster_test_util.h"
#include "tests/cluster/local_cluster.h"

namespace baton::testing {
namespace {

struct HandoffFault {
  std::string name;
  // The role of the two workers armed with `fault` (the other pool has one
  // worker, unarmed).
  std::string role;
  std::string fault;
};

// The test's name in ctest: its fault spec.
void PrintTo(const HandoffFault& fault, std::ostream* os) {
  *os << fault.role << " --fault=" << fault.fault;
}

class ClusterHandoffFaultTest : public ::testing::TestWithParam<HandoffFault> {
};

TEST_P(ClusterHandoffFaultTest, WorkerKilledThereLosesNothing) {
  const HandoffFault& c = GetParam();
  LocalClusterOptions options;
  options.prefill = c.role == "prefill" ? 2 : 1;
  options.decode = c.role == "decode" ? 2 : 1;
  // Both armed: the first to reach the point is killed there, the other
  // (serving the request's next attempt) continued.
  const int first = c.role == "prefill" ? 0 : options.prefill;
  options.flags_of_worker[first] = {"--fault=" + c.fault};
  options.flags_of_worker[first + 1] = {"--fault=" + c.fault};
  auto cluster = StartOrDie(options);
  ASSERT_NE(cluster, nullptr);
  v1::GenerateRequest request = LongRequest(0, 16);
  request.mutable_sampling()->set_temperature(0);

  StreamResult faulted;
  std::thread client([&] { faulted = RunGenerate(cluster->baton(), request); });
  const absl::StatusOr<int> victim =
      cluster->WaitForStoppedWorker(absl::Seconds(120));
  if (victim.ok()) cluster->Kill(*victim);
  const absl::StatusOr<int> next =
      victim.ok() ? cluster->WaitForStoppedWorker(absl::Seconds(120))
                  : victim.status();
  if (next.ok()) cluster->workers()[*next].process->Signal(SIGCONT);
  client.join();
  ASSERT_TRUE(victim.ok()) << victim.status() << "; " << Describe(faulted);
  ASSERT_TRUE(next.ok()) << next.status() << "; " << Describe(faulted);
  EXPECT_EQ(cluster->workers()[*victim].role, c.role);
  EXPECT_EQ(*next, 2 * first + 1 - *victim);
  ASSERT_TRUE(faulted.status.ok() && faulted.has_result) << Describe(faulted);
  EXPECT_EQ(faulted.tokens.size(), 16u) << Describe(faulted);
  ExpectAllFree(*cluster);

  // The fault-free run, on the survivors.
  const StreamResult clean = RunGenerate(cluster->baton(), request);
  ASSERT_TRUE(clean.status.ok() && clean.has_result) << Describe(clean);
  EXPECT_EQ(faulted.tokens, clean.tokens);
  EXPECT_EQ(faulted.text, clean.text);
  ExpectAllFree(*cluster);
  ExpectCleanStop(*cluster);
}

INSTANTIATE_TEST_SUITE_P(
    Steps, ClusterHandoffFaultTest,
    ::testing::Values(HandoffFault{"PrefillKilledAfterItsFirstLayerLeft",
                                   "prefill", "kv_layer_sent:stop@1"},
                      HandoffFault{"PrefillKilledAfterItsLastLayerLeft",
                                   "prefill", "kv_layer_sent:stop@30"},
                      HandoffFault{"DecodeKilledAfterReservingBeforeItsReply",
                                   "decode", "kv_reserved:stop"},
                      HandoffFault{"DecodeKilledAsTheTransferReachedIt",
                                   "decode", "kv_import_started:stop"},
                      HandoffFault{"DecodeKilledMidImport", "decode",
                                   "kv_layer_imported:stop@15"}),
    [](const ::testing::TestParamInfo<HandoffFault>& info) {
      return info.param.name;
    });

// The prefill worker's sender flips a bit of the third layer's checksum
// (--fault=kv_layer_corrupt:error@3), which the decode worker's receiver
// cannot tell from a payload byte corrupted on the wire: it fails the
// transfer with DATA_LOSS. The coordinator starts the request over (or
// migrates it, had its first token been streamed), the next transfer is
// clean, and the seeded answer equals a fault-free run's; no block is held.
TEST(ClusterHandoffCorruptionTest, CorruptedLayerIsComputedAndSentAgain) {
  LocalClusterOptions options;
  options.flags_of_worker[0] = {"--fault=kv_layer_corrupt:error@3"};
  auto cluster = StartOrDie(options);
  ASSERT_NE(cluster, nullptr);
  ASSERT_EQ(cluster->workers()[0].role, "prefill");
  const v1::GenerateRequest request = LongRequest(1, 16);  // seeded

  const StreamResult faulted = RunGenerate(cluster->baton(), request);
  ASSERT_TRUE(faulted.status.ok() && faulted.has_result) << Describe(faulted);
  EXPECT_EQ(faulted.tokens.size(), 16u) << Describe(faulted);
  EXPECT_EQ(faulted.result.retries() + faulted.result.migrations(), 1)
      << "the corrupted transfer was not sent again: " << Describe(faulted);
  ExpectAllFree(*cluster);

  const StreamResult clean = RunGenerate(cluster->baton(), request);
  ASSERT_TRUE(clean.status.ok() && clean.has_result) << Describe(clean);
  EXPECT_EQ(clean.result.retries() + clean.result.migrations(), 0);
  EXPECT_EQ(faulted.tokens, clean.tokens);
  EXPECT_EQ(faulted.text, clean.text);
  ExpectAllFree(*cluster);
  ExpectCleanStop(*cluster);
}

}  // namespace
}  // namespace baton::testing
