// Prefix-aware routing on two colocated workers: each conversation's next
// turn goes to the worker whose prefix cache holds the previous turn (the
// coordinator learns it from the workers' heartbeats), reuses exactly the
// blocks that turn computed, and answers as a cold cache does.
#include <grpcpp/grpcpp.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/cluster/cluster_test_util.h"
#include "tests/cluster/local_cluster.h"

namespace baton::testing {
namespace {

constexpr int64_t kBlockSize = 16;

class ClusterPrefixCacheTest : public ::testing::Test {
 protected:
  std::vector<int32_t> Tokenize(const std::string& text) {
    grpc::ClientContext context;
    v1::TokenizeRequest request;
    request.set_text(text);
    v1::TokenizeResponse response;
    grpc::Status s = cluster_->baton().Tokenize(&context, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return {response.token_ids().begin(), response.token_ids().end()};
  }

  static v1::GenerateRequest Ids(const std::vector<int32_t>& ids) {
    v1::GenerateRequest request;
    for (int32_t id : ids) request.mutable_token_ids()->add_token_ids(id);
    request.mutable_sampling()->set_max_tokens(12);
    request.mutable_sampling()->set_temperature(0);
    request.mutable_sampling()->set_ignore_eos(true);
    return request;
  }

  // Blocks the coordinator's index holds for each worker, by id.
  std::map<std::string, int64_t> IndexedBlocks() {
    grpc::ClientContext context;
    v1::GetClusterStatusResponse status;
    EXPECT_TRUE(
        cluster_->baton()
            .GetClusterStatus(&context, v1::GetClusterStatusRequest(), &status)
            .ok());
    std::map<std::string, int64_t> out;
    for (const v1::WorkerStatus& w : status.workers()) {
      out[w.worker().worker_id()] = w.prefix_cache_blocks();
    }
    return out;
  }

  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(ClusterPrefixCacheTest, NextTurnGoesWhereThePreviousOneIsCached) {
  LocalClusterOptions options;
  options.prefill = 0;
  options.decode = 0;
  options.both = 2;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  cluster_ = std::move(*cluster);

  // Two conversations whose first turns run at once, so least-loaded puts
  // them on different workers (the first claim counts as queued work when
  // the second is routed). Set up again, a bounded number of times, if
  // both landed on one worker: that is a precondition, not the check.
  struct Conversation {
    std::vector<int32_t> turn1;
    StreamResult first;
  };
  std::vector<Conversation> convs(2);
  for (int attempt = 0; attempt < 5; ++attempt) {
    for (int c = 0; c < 2; ++c) {
      convs[c].turn1 = Tokenize(absl::StrCat(
          "<|im_start|>system\nYou are assistant number ", attempt * 2 + c,
          ". You answer briefly and you always name one example.<|im_end|>\n"
          "<|im_start|>user\nTell me about ",
          c == 0 ? "rivers" : "mountains", ".<|im_end|>\n",
          "<|im_start|>assistant\n"));
    }
    std::thread other([&] {
      convs[1].first = RunGenerate(cluster_->baton(), Ids(convs[1].turn1));
    });
    convs[0].first = RunGenerate(cluster_->baton(), Ids(convs[0].turn1));
    other.join();
    for (const Conversation& c : convs) {
      ASSERT_TRUE(c.first.has_result) << Describe(c.first);
      ASSERT_EQ(c.first.result.usage().cached_tokens(), 0);
    }
    if (convs[0].first.result.prefill_worker().worker_id() !=
        convs[1].first.result.prefill_worker().worker_id()) {
      break;
    }
  }
  ASSERT_NE(convs[0].first.result.prefill_worker().worker_id(),
            convs[1].first.result.prefill_worker().worker_id())
      << "five pairs of concurrent first turns all landed on one worker";

  // The turns' blocks reach the coordinator with the next heartbeats.
  const absl::Time until = absl::Now() + DefaultTestDeadline();
  auto indexed = [&] {
    std::map<std::string, int64_t> blocks = IndexedBlocks();
    for (const Conversation& c : convs) {
      const int64_t fed =
          static_cast<int64_t>(c.turn1.size() + c.first.tokens.size()) - 1;
      if (blocks[c.first.result.prefill_worker().worker_id()] <
          fed / kBlockSize) {
        return false;
      }
    }
    return true;
  };
  while (!indexed()) {
    ASSERT_LT(absl::Now(), until) << "the coordinator never indexed the turns";
    absl::SleepFor(absl::Milliseconds(20));
  }

  const std::vector<int32_t> next = Tokenize(
      "<|im_end|>\n<|im_start|>user\nAnd one more?<|im_end|>\n"
      "<|im_start|>assistant\n");
  std::vector<StreamResult> second(2);
  std::vector<v1::GenerateRequest> turn2s(2);
  for (int c = 0; c < 2; ++c) {
    std::vector<int32_t> turn2 = convs[c].turn1;
    turn2.insert(turn2.end(), convs[c].first.tokens.begin(),
                 convs[c].first.tokens.end());
    turn2.insert(turn2.end(), next.begin(), next.end());
    turn2s[c] = Ids(turn2);
    second[c] = RunGenerate(cluster_->baton(), turn2s[c]);
    ASSERT_TRUE(second[c].has_result) << Describe(second[c]);
    EXPECT_EQ(second[c].result.prefill_worker().worker_id(),
              convs[c].first.result.prefill_worker().worker_id())
        << "conversation " << c;
    // Every full block of turn 1's prompt and answer but the last token.
    const int64_t fed = static_cast<int64_t>(convs[c].turn1.size() +
                                             convs[c].first.tokens.size()) -
                        1;
    EXPECT_EQ(second[c].result.usage().cached_tokens(),
              std::min(fed, static_cast<int64_t>(turn2.size()) - 1) /
                  kBlockSize * kBlockSize)
        << "conversation " << c;
  }

  // A cold cache gives the same answers.
  grpc::ClientContext context;
  v1::ResetPrefixCacheResponse reset;
  ASSERT_TRUE(
      cluster_->baton()
          .ResetPrefixCache(&context, v1::ResetPrefixCacheRequest(), &reset)
          .ok());
  EXPECT_EQ(reset.workers_reset(), 2);
  for (int c = 0; c < 2; ++c) {
    StreamResult cold = RunGenerate(cluster_->baton(), turn2s[c]);
    ASSERT_TRUE(cold.has_result) << Describe(cold);
    EXPECT_EQ(cold.result.usage().cached_tokens(), 0);
    EXPECT_EQ(cold.tokens, second[c].tokens) << "conversation " << c;
  }
  EXPECT_TRUE(cluster_->WaitAllFree(absl::Seconds(10)).ok());
}

}  // namespace
}  // namespace baton::testing
