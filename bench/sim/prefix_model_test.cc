#include "bench/sim/prefix_model.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "bench/sim/simulator.h"
#include "bench/sim/workload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::sim {
namespace {

using ::testing::HasSubstr;

// Prefill costs 1 ms per token, a decode step 1 ms, a transfer 1 ms per
// token (so a transfer of what is missing shows in the first gap).
WorkerProfile TokenProfile() {
  WorkerProfile p;
  p.prefill.c1 = 1e-3;
  p.decode.c0 = 1e-3;
  p.kv_bytes_per_token = 1000;
  p.transfer_alpha_s = 0;
  p.transfer_bytes_per_s = 1e6;
  p.kv_blocks = 1024;
  p.block_size = 16;
  p.max_batch_tokens = 4096;
  p.max_num_seqs = 64;
  return p;
}

SimRequest Prompt(double at, int64_t len, std::vector<int64_t> ids) {
  SimRequest r{at, len, 4};
  r.piece_ids = std::move(ids);
  return r;
}

TEST(BlockLruTest, EvictsLeastRecentlyUsedLeavesFirst) {
  BlockLru lru;
  std::vector<BlockHash> stored, removed;
  const std::vector<BlockHash> chain = {{1, 1}, {1, 2}, {1, 3}};
  lru.Store(chain, 10, &stored, &removed);
  EXPECT_EQ(stored.size(), 3u);
  EXPECT_EQ(lru.Match(chain), 3);
  // Room for two: the leaf goes, the prefix stays usable.
  lru.Shrink(2, &removed);
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(removed[0], (BlockHash{1, 3}));
  EXPECT_EQ(lru.Match(chain), 2);
  lru.Shrink(0, &removed);
  EXPECT_EQ(lru.Match(chain), 0);
}

TEST(BlockLruTest, ARefreshedBlockOutlivesOlderOnesAndNodesAreReused) {
  BlockLru lru;
  std::vector<BlockHash> stored, removed;
  const std::vector<BlockHash> a = {{1, 1}, {1, 2}, {1, 3}};
  const std::vector<BlockHash> b = {{2, 1}, {2, 2}};
  lru.Store(a, 10, &stored, &removed);
  lru.Store(b, 10, &stored, &removed);
  lru.Store(std::span(a).first(1), 10, &stored, &removed);  // a's block 0
  EXPECT_EQ(stored.size(), 5u);
  lru.Shrink(3, &removed);
  EXPECT_EQ(removed, (std::vector<BlockHash>{{1, 3}, {1, 2}}));
  EXPECT_EQ(lru.Match(a), 1);
  EXPECT_EQ(lru.Match(b), 2);
  // Freed nodes take new blocks; the order stays consistent.
  stored.clear();
  removed.clear();
  const std::vector<BlockHash> c = {{3, 1}, {3, 2}, {3, 3}, {3, 4}};
  lru.Store(c, 5, &stored, &removed);
  EXPECT_EQ(stored.size(), 4u);
  EXPECT_EQ(removed, (std::vector<BlockHash>{{2, 2}, {2, 1}}));
  EXPECT_EQ(lru.Match(c), 4);
  EXPECT_EQ(lru.Match(a), 1);
  EXPECT_EQ(lru.size(), 5);
}

TEST(PrefixModelTest, MapsPiecesOntoFullBlocks) {
  PrefixModel model(16, 512);
  // 520 tokens: 32 blocks of piece 7, then no full block of piece 9.
  const auto chain = model.Chain(std::vector<int64_t>{7, 9}, 520);
  ASSERT_EQ(chain.size(), 32u);
  EXPECT_EQ(chain[0], (BlockHash{7, 1}));
  EXPECT_EQ(chain[31], (BlockHash{7, 32}));
  EXPECT_EQ(model.Chain(std::vector<int64_t>{7, 9}, 544).size(), 34u);
  EXPECT_TRUE(model.Chain({}, 544).empty());
}

// A second request with the same 512-token prefix computes only its own
// tokens (and the cache off computes them all); a prompt cached whole still
// computes its last token.
TEST(SimulatorPrefixTest, ASharedPrefixIsComputedOnce) {
  for (bool on : {true, false}) {
    SimOptions options;
    ASSERT_TRUE(ParseShape("1C", &options).ok());
    options.profile = TokenProfile();
    options.prefix_cache = on;
    const std::vector<SimRequest> requests = {
        Prompt(0, 600, {1, 2}), Prompt(10, 600, {1, 3}), Prompt(20, 512, {1})};
    auto result = Simulate(options, requests);
    ASSERT_TRUE(result.ok()) << result.status();
    const auto& r = result->records;
    EXPECT_EQ(r[0].cached_tokens, 0);
    EXPECT_EQ(r[1].cached_tokens, on ? 512 : 0);
    // A prompt cached whole still computes the block of its last token,
    // as the engine does (Scheduler::Admit shares the blocks before it).
    EXPECT_EQ(r[2].cached_tokens, on ? 496 : 0);
    EXPECT_NEAR(r[1].ttft_ms, on ? 88 : 600, 1e-6);
    EXPECT_NEAR(r[2].ttft_ms, on ? 16 : 512, 1e-6);
    EXPECT_EQ(result->cached_tokens, on ? 1008 : 0);
  }
}

// A prefill worker publishes a chunked prompt's full blocks after each of
// its steps, as the engine does: a prompt admitted while another with the
// same prefix is still being chunked reuses what was computed so far.
TEST(SimulatorPrefixTest, AChunkedPromptIsSharedBeforeItsLastChunk) {
  SimOptions options;
  ASSERT_TRUE(ParseShape("1P1D", &options).ok());
  options.profile = TokenProfile();
  options.profile.max_batch_tokens = 256;
  // 1,000 tokens in chunks of 256, 256, 256 and 232: the second prompt,
  // there since the first chunk, is admitted beside the last one (24
  // tokens of room), when 768 tokens of the first (its piece 1 whole) are
  // cached.
  const std::vector<SimRequest> requests = {Prompt(0, 1000, {1, 2}),
                                            Prompt(0.1, 600, {1, 3})};
  auto result = Simulate(options, requests);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->records[0].cached_tokens, 0);
  EXPECT_EQ(result->records[1].cached_tokens, 512);
}

// Least-loaded routing weighs the coordinator's PrefixIndex: the next turn
// of a conversation goes back to the prefill worker that holds it.
TEST(SimulatorPrefixTest, RoutingFollowsTheCachedPrefix) {
  SimOptions options;
  ASSERT_TRUE(ParseShape("4C", &options).ok());
  options.profile = TokenProfile();
  std::vector<SimRequest> requests;
  for (int turn = 0; turn < 4; ++turn) {
    for (int64_t conv = 0; conv < 4; ++conv) {
      std::vector<int64_t> ids;
      for (int i = 0; i <= turn; ++i) ids.push_back(100 * conv + i);
      requests.push_back(Prompt(10.0 * turn + 0.001 * static_cast<double>(conv),
                                512 * (turn + 1), ids));
    }
  }
  auto result = Simulate(options, requests);
  ASSERT_TRUE(result.ok()) << result.status();
  for (size_t i = 4; i < requests.size(); ++i) {
    EXPECT_EQ(result->records[i].prefill_worker,
              result->records[i - 4].prefill_worker)
        << "request " << i;
    EXPECT_EQ(result->records[i].cached_tokens, 512 * static_cast<int>(i / 4));
  }
}

// A split request whose decode worker already holds the prefix moves only
// the rest: its first decode step waits for a shorter transfer.
TEST(SimulatorPrefixTest, TheTransferCarriesOnlyWhatTheDecodeWorkerLacks) {
  SimOptions options;
  ASSERT_TRUE(ParseShape("1P1D", &options).ok());
  options.profile = TokenProfile();
  options.profile.prefill.c1 = 1e-5;  // the transfer dominates
  const std::vector<SimRequest> requests = {Prompt(0, 1024, {1, 2}),
                                            Prompt(10, 1024, {1, 3})};
  auto result = Simulate(options, requests);
  ASSERT_TRUE(result.ok()) << result.status();
  // 1000 bytes per token at 1 MB/s: 1 ms per token moved.
  EXPECT_GT(result->records[0].itl_ms.front(), 1000);
  EXPECT_LT(result->records[1].itl_ms.front(), 520);
  EXPECT_GT(result->records[1].itl_ms.front(), 500);
}

// As the coordinator's --local_prefill_tokens: a request whose prompt the
// decode worker holds but for a few tokens is prefilled there, colocated,
// and nothing moves; with 0, it goes to the prefill worker and the missing
// blocks cross over.
TEST(SimulatorPrefixTest, AShortRestIsPrefilledOnTheDecodeWorkerHoldingIt) {
  for (int64_t local : {256, 87, 0}) {
    SimOptions options;
    ASSERT_TRUE(ParseShape("1P1D", &options).ok());
    options.profile = TokenProfile();
    options.profile.prefill.c1 = 1e-5;  // a transfer outlasts its prefill
    options.local_prefill_tokens = local;
    // The second shares the first's piece 1 (512 tokens): 88 to compute.
    const std::vector<SimRequest> requests = {Prompt(0, 600, {1, 2}),
                                              Prompt(10, 600, {1, 3})};
    auto result = Simulate(options, requests);
    ASSERT_TRUE(result.ok()) << result.status();
    const auto& r = result->records;
    EXPECT_EQ(r[0].prefill_worker, "p0");
    EXPECT_EQ(r[1].cached_tokens, 512) << local;
    EXPECT_NEAR(r[1].ttft_ms, 0.88, 1e-6) << local;
    EXPECT_EQ(r[1].decode_worker, "d0");
    if (local >= 88) {
      EXPECT_EQ(r[1].prefill_worker, "d0");
      EXPECT_NEAR(r[1].itl_ms.front(), 1, 1e-3);  // one decode step
    } else {
      EXPECT_EQ(r[1].prefill_worker, "p0") << local;
      EXPECT_GT(r[1].itl_ms.front(), 80) << local;  // 88 tokens moved
    }
  }
}

TEST(MooncakeTraceTest, ReadsJsonLinesAndNamesABadRow) {
  const std::string path = testing::TempDir() + "/mooncake.jsonl";
  {
    std::ofstream out(path);
    out << R"({"timestamp": 1500, "input_length": 600, "output_length": 5, "hash_ids": [3, 4]})"
        << "\n"
        << R"({"timestamp": 0, "input_length": 100, "output_length": 2, "hash_ids": [5]})"
        << "\n";
  }
  auto trace = ReadTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->size(), 2u);
  EXPECT_EQ((*trace)[0].arrival_s, 0);
  EXPECT_EQ((*trace)[1].arrival_s, 1.5);
  EXPECT_EQ((*trace)[1].input_len, 600);
  EXPECT_EQ((*trace)[1].piece_ids, (std::vector<int64_t>{3, 4}));
  {
    std::ofstream out(path, std::ios::app);
    out << R"({"timestamp": 2, "input_length": "many"})"
        << "\n";
  }
  auto bad = ReadTrace(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("mooncake.jsonl:3"));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace baton::sim
