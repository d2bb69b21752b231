// Prefix-aware routing: on two colocated workers, each conversation's next
// turn goes to the worker whose prefix cache holds the previous turn (the
// coordinator learns it from the workers' heartbeats), reuses exactly the
// blocks that turn computed, and answers as a cold cache does; on 1P2D, the
// next turn goes to the decode worker holding the previous one, which
// receives only the blocks it lacks, or, when what it lacks is short
// (--local_prefill_tokens), prefills those tokens itself and receives
// nothing.
#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/metrics/http_get.h"
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

  // Baton.ResetPrefixCache: the number of workers that emptied theirs, or
  // -1 (a test failure) if the call failed.
  int ResetPrefixCache() {
    grpc::ClientContext context;
    v1::ResetPrefixCacheResponse reset;
    const grpc::Status s = cluster_->baton().ResetPrefixCache(
        &context, v1::ResetPrefixCacheRequest(), &reset);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return s.ok() ? reset.workers_reset() : -1;
  }

  // Blocks the coordinator's index holds for `worker` reach at least
  // `blocks` (the heartbeats carry them); fails the test otherwise.
  void WaitIndexed(const std::string& worker, int64_t blocks) {
    const absl::Time until = absl::Now() + DefaultTestDeadline();
    while (IndexedBlocks()[worker] < blocks) {
      ASSERT_LT(absl::Now(), until) << "the coordinator never indexed "
                                    << blocks << " blocks of " << worker;
      absl::SleepFor(absl::Milliseconds(20));
    }
  }

  // baton_worker_kv_transfer_bytes_total{direction="received"} of the
  // worker serving metrics at `address`.
  static int64_t ReceivedKvBytes(const std::string& address) {
    absl::StatusOr<std::string> body = metrics::HttpGet(address, "/metrics");
    EXPECT_TRUE(body.ok()) << body.status();
    if (!body.ok()) return -1;
    const std::string name = "baton_worker_kv_transfer_bytes_total{";
    for (absl::string_view line : absl::StrSplit(*body, '\n')) {
      if (!absl::StartsWith(line, name) ||
          !absl::StrContains(line, "direction=\"received\"")) {
        continue;
      }
      double value = 0;
      EXPECT_TRUE(absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value))
          << line;
      return static_cast<int64_t>(value);
    }
    ADD_FAILURE() << "no received " << name << "} in the metrics of "
                  << address;
    return -1;
  }

  struct Conversation {
    std::vector<int32_t> turn1;
    StreamResult first;
    // Tokens of turn 1 the decode worker fed, so holds: its prompt and
    // answer but the answer's last token.
    int64_t fed() const {
      return static_cast<int64_t>(turn1.size() + first.tokens.size()) - 1;
    }
    // Turn 1's prompt and answer, then `next`.
    std::vector<int32_t> Turn2(const std::vector<int32_t>& next) const {
      std::vector<int32_t> turn2 = turn1;
      turn2.insert(turn2.end(), first.tokens.begin(), first.tokens.end());
      turn2.insert(turn2.end(), next.begin(), next.end());
      return turn2;
    }
  };

  // Two conversations whose first turns run at once, with prompts
  // prompt(attempt, c): the coordinator counts the first one's claim when
  // it routes the second, so they land on different workers of the phase
  // (`decode` or prefill). Set up again, a bounded number of times, if
  // not: that is a precondition, not the check.
  std::vector<Conversation> StartTwoConversations(
      const std::function<std::string(int attempt, int c)>& prompt,
      bool decode) {
    auto worker = [decode](const Conversation& c) {
      return decode ? c.first.result.decode_worker().worker_id()
                    : c.first.result.prefill_worker().worker_id();
    };
    std::vector<Conversation> convs(2);
    for (int attempt = 0; attempt < 5; ++attempt) {
      for (int c = 0; c < 2; ++c) convs[c].turn1 = Tokenize(prompt(attempt, c));
      std::thread other([&] {
        convs[1].first = RunGenerate(cluster_->baton(), Ids(convs[1].turn1));
      });
      convs[0].first = RunGenerate(cluster_->baton(), Ids(convs[0].turn1));
      other.join();
      for (const Conversation& c : convs) {
        EXPECT_TRUE(c.first.has_result) << Describe(c.first);
        if (!c.first.has_result) return {};
      }
      if (worker(convs[0]) != worker(convs[1])) return convs;
    }
    ADD_FAILURE() << "five pairs of concurrent first turns all landed on one "
                  << (decode ? "decode" : "prefill") << " worker";
    return {};
  }

  // Starts `options` (1P2D) with a metrics listener on both decode workers,
  // whose addresses go to metrics_of_.
  void StartWithDecodeMetrics(LocalClusterOptions options) {
    options.prefill = 1;
    options.decode = 2;
    options.flags_of_worker[1] = {"--metrics_listen=127.0.0.1:0"};
    options.flags_of_worker[2] = {"--metrics_listen=127.0.0.1:0"};
    auto cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
    for (int i : {1, 2}) {
      LocalCluster::Worker& w = cluster_->workers()[static_cast<size_t>(i)];
      const std::string marker = "baton-worker metrics on ";
      auto line = w.process->WaitForLine(marker, absl::Seconds(10));
      ASSERT_TRUE(line.ok()) << line.status();
      metrics_of_[w.address] = line->substr(marker.size());
    }
  }

  // Two conversations whose first turns decode on different workers.
  std::vector<Conversation> StartOnTwoDecodeWorkers() {
    return StartTwoConversations(
        [](int attempt, int c) {
          return absl::StrCat(
              "<|im_start|>system\nYou are careful assistant number ",
              attempt * 2 + c,
              ". You answer in full sentences, you give one example for "
              "every claim, and you never use lists.<|im_end|>\n"
              "<|im_start|>user\nWhy do ",
              c == 0 ? "rivers meander across flat land"
                     : "glaciers carve valleys",
              "?<|im_end|>\n<|im_start|>assistant\n");
        },
        /*decode=*/true);
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::map<std::string, std::string> metrics_of_;  // worker address -> metrics
};

TEST_F(ClusterPrefixCacheTest, NextTurnGoesWhereThePreviousOneIsCached) {
  LocalClusterOptions options;
  options.prefill = 0;
  options.decode = 0;
  options.both = 2;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  cluster_ = std::move(*cluster);

  // Two conversations on different workers.
  const std::vector<Conversation> convs = StartTwoConversations(
      [](int attempt, int c) {
        return absl::StrCat(
            "<|im_start|>system\nYou are assistant number ", attempt * 2 + c,
            ". You answer briefly and you always name one example.<|im_end|>"
            "\n<|im_start|>user\nTell me about ",
            c == 0 ? "rivers" : "mountains", ".<|im_end|>\n",
            "<|im_start|>assistant\n");
      },
      /*decode=*/false);
  ASSERT_EQ(convs.size(), 2u);
  for (const Conversation& c : convs) {
    ASSERT_EQ(c.first.result.usage().cached_tokens(), 0);
    // The turn's blocks reach the coordinator with the next heartbeats.
    WaitIndexed(c.first.result.prefill_worker().worker_id(),
                c.fed() / kBlockSize);
  }

  const std::vector<int32_t> next = Tokenize(
      "<|im_end|>\n<|im_start|>user\nAnd one more?<|im_end|>\n"
      "<|im_start|>assistant\n");
  std::vector<StreamResult> second(2);
  std::vector<v1::GenerateRequest> turn2s(2);
  for (int c = 0; c < 2; ++c) {
    const std::vector<int32_t> turn2 = convs[c].Turn2(next);
    turn2s[c] = Ids(turn2);
    second[c] = RunGenerate(cluster_->baton(), turn2s[c]);
    ASSERT_TRUE(second[c].has_result) << Describe(second[c]);
    EXPECT_EQ(second[c].result.prefill_worker().worker_id(),
              convs[c].first.result.prefill_worker().worker_id())
        << "conversation " << c;
    // Every full block of turn 1's prompt and answer but the last token.
    EXPECT_EQ(second[c].result.usage().cached_tokens(),
              std::min(convs[c].fed(), static_cast<int64_t>(turn2.size()) - 1) /
                  kBlockSize * kBlockSize)
        << "conversation " << c;
  }

  // A cold cache gives the same answers.
  EXPECT_EQ(ResetPrefixCache(), 2);
  for (int c = 0; c < 2; ++c) {
    StreamResult cold = RunGenerate(cluster_->baton(), turn2s[c]);
    ASSERT_TRUE(cold.has_result) << Describe(cold);
    EXPECT_EQ(cold.result.usage().cached_tokens(), 0);
    EXPECT_EQ(cold.tokens, second[c].tokens) << "conversation " << c;
  }
  EXPECT_TRUE(cluster_->WaitAllFree(absl::Seconds(10)).ok());
}

// 1P2D: the second turn of a conversation goes to the decode worker that
// decoded the first, which pins the blocks of turn 1 it holds and receives
// only the rest; the KV bytes its metrics count are exactly those blocks,
// and the answer equals the one a cold cache (everything sent) gives. Two
// conversations start on different decode workers, so for one of them the
// holder is not the worker a cache-blind policy would pick.
TEST_F(ClusterPrefixCacheTest, NextTurnMovesOnlyTheBlocksTheDecodeWorkerLacks) {
  LocalClusterOptions options;
  ASSERT_NO_FATAL_FAILURE(StartWithDecodeMetrics(options));
  const std::vector<Conversation> convs = StartOnTwoDecodeWorkers();
  ASSERT_EQ(convs.size(), 2u);

  const std::vector<int32_t> next = Tokenize(
      "<|im_end|>\n<|im_start|>user\nAnd what about mountain streams?"
      "<|im_end|>\n<|im_start|>assistant\n");
  std::vector<v1::GenerateRequest> turn2s(2);
  std::vector<StreamResult> seconds(2);
  std::vector<int64_t> full_bytes(2);
  for (int c = 0; c < 2; ++c) {
    const Conversation& conv = convs[c];
    const v1::GenerateResult& r1 = conv.first.result;
    const v1::WorkerRef holder = r1.decode_worker();
    ASSERT_TRUE(metrics_of_.contains(holder.address())) << holder.address();
    // Bytes per block, from turn 1's transfer.
    const int64_t sent1 =
        (static_cast<int64_t>(conv.turn1.size()) + kBlockSize - 1) /
            kBlockSize -
        r1.timings().kv_transfer_cached_tokens() / kBlockSize;
    ASSERT_GT(sent1, 0);
    const int64_t block_bytes = r1.timings().kv_transfer_bytes() / sent1;
    ASSERT_GT(block_bytes, 0);
    EXPECT_EQ(block_bytes * sent1, r1.timings().kv_transfer_bytes());
    // The decode worker caches turn 1's prompt and answer (but the
    // answer's last token, never fed); the coordinator learns it from the
    // heartbeats.
    const int64_t fed = conv.fed();
    WaitIndexed(holder.worker_id(), fed / kBlockSize);

    const std::vector<int32_t> turn2 = conv.Turn2(next);
    const int64_t n2 = static_cast<int64_t>(turn2.size());
    const int64_t blocks2 = (n2 + kBlockSize - 1) / kBlockSize;
    const int64_t cached = std::min(fed, n2 - 1) / kBlockSize;
    const int64_t before = ReceivedKvBytes(metrics_of_[holder.address()]);
    const StreamResult second = RunGenerate(cluster_->baton(), Ids(turn2));
    ASSERT_TRUE(second.has_result) << Describe(second);
    EXPECT_EQ(second.result.decode_worker().worker_id(), holder.worker_id())
        << "conversation " << c;
    EXPECT_EQ(second.result.timings().kv_transfer_cached_tokens(),
              cached * kBlockSize)
        << "conversation " << c;
    const int64_t moved =
        ReceivedKvBytes(metrics_of_[holder.address()]) - before;
    EXPECT_EQ(moved, (blocks2 - cached) * block_bytes)
        << "conversation " << c << ": " << cached << " of " << blocks2
        << " blocks were cached";
    EXPECT_EQ(second.result.timings().kv_transfer_bytes(), moved);
    turn2s[c] = Ids(turn2);
    seconds[c] = second;
    full_bytes[c] = blocks2 * block_bytes;
  }

  // A cold cache sends everything and answers the same.
  EXPECT_EQ(ResetPrefixCache(), 3);
  for (int c = 0; c < 2; ++c) {
    const StreamResult cold = RunGenerate(cluster_->baton(), turn2s[c]);
    ASSERT_TRUE(cold.has_result) << Describe(cold);
    EXPECT_EQ(cold.result.timings().kv_transfer_cached_tokens(), 0);
    EXPECT_EQ(cold.result.timings().kv_transfer_bytes(), full_bytes[c]);
    EXPECT_EQ(cold.tokens, seconds[c].tokens) << "conversation " << c;
  }
  EXPECT_TRUE(cluster_->WaitAllFree(absl::Seconds(10)).ok());
}

// 1P2D with --local_prefill_tokens=256: the second turn, whose
// history the decode worker of the first holds but for its last block and
// the new user message, is served there colocated: that worker prefills
// the missing tokens itself, nothing moves, the prefill worker is not
// involved, and the answer equals the one a cold cache (split, everything
// computed and sent) gives.
TEST_F(ClusterPrefixCacheTest,
       ShortRestOfANextTurnIsPrefilledWhereItsHistoryIs) {
  LocalClusterOptions options;
  options.local_prefill_tokens = 256;
  ASSERT_NO_FATAL_FAILURE(StartWithDecodeMetrics(options));
  const std::vector<Conversation> convs = StartOnTwoDecodeWorkers();
  ASSERT_EQ(convs.size(), 2u);
  const std::string prefill_id =
      convs[0].first.result.prefill_worker().worker_id();

  const std::vector<int32_t> next = Tokenize(
      "<|im_end|>\n<|im_start|>user\nAnd in deserts?<|im_end|>\n"
      "<|im_start|>assistant\n");
  std::vector<v1::GenerateRequest> turn2s(2);
  std::vector<StreamResult> locals(2);
  for (int c = 0; c < 2; ++c) {
    const Conversation& conv = convs[c];
    const v1::WorkerRef holder = conv.first.result.decode_worker();
    ASSERT_NE(holder.worker_id(), prefill_id);
    ASSERT_TRUE(metrics_of_.contains(holder.address())) << holder.address();
    const int64_t fed = conv.fed();
    WaitIndexed(holder.worker_id(), fed / kBlockSize);

    const std::vector<int32_t> turn2 = conv.Turn2(next);
    const int64_t n2 = static_cast<int64_t>(turn2.size());
    const int64_t cached = std::min(fed, n2 - 1) / kBlockSize * kBlockSize;
    ASSERT_LE(n2 - cached, 256) << "the rest must be short for this test";
    const int64_t before = ReceivedKvBytes(metrics_of_[holder.address()]);
    turn2s[c] = Ids(turn2);
    locals[c] = RunGenerate(cluster_->baton(), turn2s[c]);
    const StreamResult& local = locals[c];
    ASSERT_TRUE(local.has_result) << Describe(local);
    EXPECT_EQ(local.result.prefill_worker().worker_id(), holder.worker_id())
        << "conversation " << c;
    EXPECT_EQ(local.result.decode_worker().worker_id(), holder.worker_id())
        << "conversation " << c;
    EXPECT_EQ(local.result.usage().cached_tokens(), cached)
        << "conversation " << c;
    EXPECT_EQ(local.result.timings().kv_transfer_bytes(), 0);
    EXPECT_EQ(ReceivedKvBytes(metrics_of_[holder.address()]), before)
        << "conversation " << c;
  }

  // A cold cache: split, everything computed and sent, the same answers.
  // (The coordinator forgets what the workers held at the reset; a
  // heartbeat sent before it may bring some back until the next one.)
  EXPECT_EQ(ResetPrefixCache(), 3);
  const absl::Time until = absl::Now() + DefaultTestDeadline();
  for (const auto& [id, blocks] : IndexedBlocks()) {
    while (IndexedBlocks()[id] > 0) {
      ASSERT_LT(absl::Now(), until) << id << " still indexed after the reset";
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  for (int c = 0; c < 2; ++c) {
    const StreamResult cold = RunGenerate(cluster_->baton(), turn2s[c]);
    ASSERT_TRUE(cold.has_result) << Describe(cold);
    EXPECT_EQ(cold.result.usage().cached_tokens(), 0);
    EXPECT_EQ(cold.result.prefill_worker().worker_id(), prefill_id);
    EXPECT_GT(cold.result.timings().kv_transfer_bytes(), 0);
    EXPECT_EQ(cold.tokens, locals[c].tokens) << "conversation " << c;
  }
  EXPECT_TRUE(cluster_->WaitAllFree(absl::Seconds(10)).ok());
}

}  // namespace
}  // namespace baton::testing
