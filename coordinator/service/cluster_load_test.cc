// The load routing sees (Cluster::RoutingCandidates): the coordinator's own
// count of the prompts it sent and of the requests decoding on a worker,
// current at every pick, and of a heartbeat's queued prompt tokens and
// running sequences only those beyond that count (another replica's); and
// that a worker going DOWN leaves nothing in the prefix index.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/service/cluster.h"
#include "coordinator/service/test_cluster.h"
#include "gtest/gtest.h"

namespace baton::coordinator {
namespace {

class ClusterLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // No worker process: nothing heartbeats but the test.
    auto cluster = ClusterWithoutHeartbeats();
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
    WorkerRegistration reg;
    reg.role = WorkerRole::kBoth;
    reg.address = "127.0.0.1:1";  // never called
    reg.model_id = cluster_->model().id();
    reg.kv_layout.num_layers = 30;
    reg.kv_layout.num_kv_heads = 3;
    reg.kv_layout.head_dim = 64;
    reg.kv_layout.block_size = 16;
    reg.kv_blocks_total = 100;
    reg.context_length = 2048;
    auto worker = cluster_->registry().Register(reg);
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = *worker;
  }

  // Sends request `id` (prompt_tokens) to the worker, as a pick would.
  void Send(const std::string& id, int64_t prompt_tokens) {
    ASSERT_TRUE(
        cluster_->requests().Admit(id, RequestSpec{prompt_tokens, 10}).ok());
    ASSERT_TRUE(
        cluster_->requests().StartPrefill(id, worker_, /*split=*/false).ok());
  }

  absl::Status Heartbeat(int64_t queued_prefill_tokens,
                         int32_t running_sequences = 0) {
    WorkerLoad load;
    load.queued_prefill_tokens = queued_prefill_tokens;
    load.running_sequences = running_sequences;
    load.kv_blocks_total = 100;
    load.kv_blocks_free = 100;
    return cluster_->Heartbeat(worker_, load, {});
  }

  int64_t RoutedQueue() {
    const Candidates all = cluster_->RoutingCandidates();
    EXPECT_EQ(all.size(), 1u);
    return all.empty() ? -1 : all[0].load.queued_prefill_tokens;
  }

  int32_t RoutedSequences() {
    const Candidates all = cluster_->RoutingCandidates();
    EXPECT_EQ(all.size(), 1u);
    return all.empty() ? -1 : all[0].load.running_sequences;
  }

  std::unique_ptr<Cluster> cluster_;
  WorkerRef worker_;
};

TEST_F(ClusterLoadTest, OwnPromptsCountUntilPrefilledWhateverTheHeartbeatSays) {
  Send("a", 100);
  Send("b", 50);
  EXPECT_EQ(RoutedQueue(), 150);  // before any heartbeat
  // The worker reports both prompts queued; then both are prefilled before
  // its next heartbeat: routing must not see them any longer.
  ASSERT_TRUE(Heartbeat(150).ok());
  EXPECT_EQ(RoutedQueue(), 150);
  ASSERT_TRUE(cluster_->requests().OnFirstToken("a").ok());
  EXPECT_EQ(RoutedQueue(), 50);
  ASSERT_TRUE(cluster_->requests().OnFirstToken("b").ok());
  EXPECT_EQ(RoutedQueue(), 0);
  // A heartbeat taken before our prompt reached the worker hides nothing.
  Send("c", 70);
  ASSERT_TRUE(Heartbeat(0).ok());
  EXPECT_EQ(RoutedQueue(), 70);
}

TEST_F(ClusterLoadTest, PromptsOfOtherReplicasCountUntilTheNextHeartbeat) {
  Send("a", 100);
  // 400 queued there, 100 of them ours: 300 are another coordinator's.
  ASSERT_TRUE(Heartbeat(400).ok());
  EXPECT_EQ(RoutedQueue(), 400);
  ASSERT_TRUE(cluster_->requests().OnFirstToken("a").ok());
  EXPECT_EQ(RoutedQueue(), 300);
  ASSERT_TRUE(Heartbeat(120).ok());
  EXPECT_EQ(RoutedQueue(), 120);
  ASSERT_TRUE(Heartbeat(0).ok());
  EXPECT_EQ(RoutedQueue(), 0);
}

TEST_F(ClusterLoadTest, SequencesCountFromTheSendToTheEndWhateverTheHeartbeat) {
  // Sent to a colocated worker: it decodes there once prefilled, and the
  // tie-break between equal prompt queues counts it from the send on.
  Send("a", 100);
  Send("b", 50);
  EXPECT_EQ(RoutedSequences(), 2);
  ASSERT_TRUE(cluster_->requests().OnFirstToken("a").ok());
  EXPECT_EQ(RoutedSequences(), 2);
  // The heartbeat, taken before "a" ended, still shows it running; after
  // it ends routing no longer counts it.
  ASSERT_TRUE(Heartbeat(50, 1).ok());
  ASSERT_TRUE(cluster_->requests().OnFinished("a").ok());
  EXPECT_EQ(RoutedSequences(), 1);
  // Another replica's two sequences count until a heartbeat drops them.
  ASSERT_TRUE(Heartbeat(50, 3).ok());
  EXPECT_EQ(RoutedSequences(), 3);
  ASSERT_TRUE(cluster_->requests().Cancel("b", "client went away").ok());
  EXPECT_EQ(RoutedSequences(), 2);
  ASSERT_TRUE(Heartbeat(0, 0).ok());
  EXPECT_EQ(RoutedSequences(), 0);
  EXPECT_TRUE(cluster_->requests().CheckInvariants().ok());
}

// A worker that went DOWN leaves the prefix index (its cache is no routing
// hint, and the coordinator keeps nothing of it).
TEST_F(ClusterLoadTest, AWorkerThatGoesDownLeavesThePrefixIndex) {
  std::vector<int32_t> tokens(64);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>(i);
  }
  std::vector<BlockHash> chain;
  ExtendBlockHashes(PrefixRootHash("m"), tokens, 16, 4, &chain);
  ASSERT_TRUE(cluster_->prefix_index().Apply(worker_.id, true, chain, {},
                                             /*max_blocks=*/100));
  ASSERT_EQ(cluster_->prefix_index().NumBlocks(worker_.id), 4);
  ASSERT_TRUE(cluster_->registry().Remove(worker_, "test").ok());
  cluster_->Sweep();
  EXPECT_EQ(cluster_->prefix_index().NumBlocks(worker_.id), 0);
}

}  // namespace
}  // namespace baton::coordinator
