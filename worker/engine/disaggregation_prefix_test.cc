// A decode engine that holds a prompt's first blocks in its prefix cache
// receives only the rest: ReserveImport pins the cached blocks and says how
// many, the prefill engine sends the blocks after them, and the decode
// engine continues from its own blocks and the received ones. Tokens and
// log-probabilities must equal a cache-off colocated run bit for bit.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "worker/engine/disaggregation_test_util.h"
#include "worker/engine/shadow_runner_test_util.h"

namespace baton::disagg_test {
namespace {

using ::baton::testing::ShadowRunner;
using ::baton::testing::ShadowRunnerControl;

// One split request's result.
struct SplitRun {
  Outcome out;
  int64_t cached_blocks = 0;  // ImportReservation::cached_blocks
  uint64_t kv_bytes = 0;      // what the handoff sent
};

class DisaggregationPrefixTest : public DisaggregationTest {
 protected:
  // A prefill engine and a decode engine (prefix cache on, the decode one
  // stepping on its own thread) joined by TCP on 127.0.0.1.
  void StartPair(const ForwardRunnerFactory& make_runner = nullptr) {
    prefill_ = MakeEngine(512, 16, 256, make_runner);
    decode_ = MakeEngine(512, 16, 256, make_runner);
    receiver_ = StartReceiver(*decode_);
    loop_ = std::thread([this] {
      while (!stop_.load()) {
        if (!decode_->Step()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
    });
  }

  void TearDown() override {
    stop_ = true;
    if (loop_.joinable()) loop_.join();
    receiver_.reset();
    if (prefill_ != nullptr) ExpectAllFree(*prefill_);
    if (decode_ != nullptr) ExpectAllFree(*decode_);
    decode_.reset();
    prefill_.reset();
  }

  // Reserves on the decode engine (with the prompt when `offer_prompt`, so
  // its prefix cache is used), prefills from the reservation's first
  // uncached block, and decodes to the end.
  SplitRun Run(const Case& c, bool offer_prompt) {
    SplitRun run;
    const uint64_t transfer_id = next_transfer_++;
    ImportOptions import =
        Import(transfer_id, static_cast<int64_t>(c.prompt.size()),
               c.params.max_tokens);
    if (offer_prompt) import.prompt = c.prompt;
    auto reservation = decode_->ReserveImport(c.id, import);
    EXPECT_TRUE(reservation.ok()) << reservation.status();
    if (!reservation.ok()) return run;
    run.cached_blocks = reservation->cached_blocks;
    PrefillOptions options;
    options.make_sink = TcpKvSinkFactory(receiver_->endpoint(), transfer_id);
    options.first_block = reservation->cached_blocks;
    PrefillResult prefill;
    EXPECT_TRUE(prefill_
                    ->SubmitPrefill({c.id, c.prompt, c.params}, options,
                                    CollectPrefill(&prefill))
                    .ok());
    prefill_->RunUntilIdle();
    EXPECT_TRUE(prefill.done && prefill.last.error.ok()) << prefill.last.error;
    if (!prefill.first.has_value()) return run;
    run.kv_bytes = prefill.last.handoff.kv_bytes;
    absl::Mutex mu;
    {
      absl::MutexLock lock(&mu);
      run.out.tokens.push_back(prefill.first->token);
      run.out.logprobs.push_back(prefill.first->logprob);
    }
    SamplingParams params = c.params;
    params.seed = prefill.seed;
    EXPECT_TRUE(decode_
                    ->StartImportedDecode({c.id, c.prompt, params},
                                          {prefill.first->token},
                                          Collect(&run.out, &mu))
                    .ok());
    absl::MutexLock lock(&mu);
    auto done = [&run] { return run.out.done; };
    mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(120));
    EXPECT_TRUE(run.out.done) << c.id << " never ended";
    // What the decode engine computed or received, and so caches: the
    // prompt and the answer but its last token (never fed back).
    std::vector<int32_t> fed = c.prompt;
    fed.insert(fed.end(), run.out.tokens.begin(), run.out.tokens.end());
    fed.pop_back();
    fed_.push_back(std::move(fed));
    return run;
  }

  // Blocks of `prompt` the decode engine must find cached: the longest run
  // of full blocks it shares with what earlier requests fed, short of the
  // block holding its last token.
  int64_t ExpectedCachedBlocks(const std::vector<int32_t>& prompt) const {
    int64_t best = 0;
    for (const std::vector<int32_t>& fed : fed_) {
      size_t common = 0;
      while (common < fed.size() && common < prompt.size() &&
             fed[common] == prompt[common]) {
        ++common;
      }
      best = std::max(best, static_cast<int64_t>(common) / 16);
    }
    return std::min(best, (static_cast<int64_t>(prompt.size()) - 1) / 16);
  }

  // The same requests on one colocated engine without a prefix cache.
  static std::map<std::string, Outcome> Reference(
      const std::vector<Case>& cases) {
    EngineOptions options;
    options.num_threads = 2;
    options.kv_cache_blocks = 256;
    options.prefix_cache = false;
    auto engine = Engine::Create(options, weights_, tokenizer_);
    EXPECT_TRUE(engine.ok()) << engine.status();
    absl::Mutex mu;
    std::map<std::string, Outcome> results;
    for (const Case& c : cases) {
      EXPECT_TRUE(
          (*engine)
              ->Submit({c.id, c.prompt, c.params}, Collect(&results[c.id], &mu))
              .ok());
    }
    (*engine)->RunUntilIdle();
    return results;
  }

  uint64_t LayerChunkBytes() const {
    return decode_->kv_cache().chunk_bytes() *
           static_cast<uint64_t>(decode_->config().num_layers);
  }

  // Turn 1 of a conversation (sent whole), then second turns that resend
  // it with its answer and different continuations: each second turn finds
  // the blocks of turn 1's prompt and answer in the decode engine's cache,
  // receives only the blocks after them, and produces the tokens of a
  // cache-off run.
  void CheckSecondTurns() {
    Case first;
    first.id = "turn1";
    first.prompt = Chat("Tell me a long story about " +
                        Repeat("a brave little lighthouse keeper, ", 6));
    first.params.max_tokens = 24;
    first.params.temperature = 0.0;
    const SplitRun turn1 = Run(first, /*offer_prompt=*/true);
    EXPECT_EQ(turn1.cached_blocks, 0);
    const int64_t blocks1 =
        (static_cast<int64_t>(first.prompt.size()) + 15) / 16;
    EXPECT_EQ(turn1.kv_bytes,
              static_cast<uint64_t>(blocks1) * LayerChunkBytes());
    ASSERT_GE(turn1.out.tokens.size(), 2u);

    std::vector<int32_t> history = first.prompt;
    history.insert(history.end(), turn1.out.tokens.begin(),
                   turn1.out.tokens.end());
    const std::vector<int32_t> next = tokenizer_->Encode(
        "<|im_end|>\n<|im_start|>user\nAnd then what "
        "happened to the keeper?<|im_end|>\n"
        "<|im_start|>assistant\n");
    std::vector<Case> cases;
    // Continuations ending on either side of block boundaries.
    for (size_t extra : {size_t{1}, size_t{5}, next.size() - 1, next.size()}) {
      Case c;
      c.id = "turn2-" + std::to_string(extra);
      c.prompt = history;
      c.prompt.insert(c.prompt.end(), next.begin(), next.begin() + extra);
      c.params.max_tokens = 8;
      c.params.temperature = extra % 2 == 0 ? 0.0 : 0.7;
      if (extra % 2 == 1) c.params.seed = 77 + extra;
      c.params.logprobs = 1;
      cases.push_back(std::move(c));
    }
    // One that differs from turn 1 inside its second block: only block 0
    // is reused.
    Case diverged = cases.back();
    diverged.id = "diverged";
    diverged.prompt[20] = diverged.prompt[20] == 42 ? 43 : 42;
    cases.push_back(diverged);
    const std::map<std::string, Outcome> reference = Reference(cases);
    for (const Case& c : cases) {
      const int64_t n = static_cast<int64_t>(c.prompt.size());
      const int64_t expected_cached = ExpectedCachedBlocks(c.prompt);
      // Turn 1's history at least; one block where the prompt diverges.
      EXPECT_GE(expected_cached,
                c.id == "diverged"
                    ? 1
                    : (static_cast<int64_t>(history.size()) - 1) / 16);
      const SplitRun run = Run(c, /*offer_prompt=*/true);
      EXPECT_EQ(run.cached_blocks, expected_cached) << c.id;
      EXPECT_EQ(run.kv_bytes,
                static_cast<uint64_t>((n + 15) / 16 - run.cached_blocks) *
                    LayerChunkBytes())
          << c.id;
      const Outcome& want = reference.at(c.id);
      EXPECT_EQ(run.out.tokens, want.tokens) << c.id;
      EXPECT_EQ(run.out.logprobs, want.logprobs) << c.id;
      EXPECT_EQ(run.out.text, want.text) << c.id;
      EXPECT_EQ(run.out.reason, want.reason) << c.id;
    }
    // Without the prompt the reservation shares nothing: everything moves,
    // with the same tokens.
    Case whole = cases.front();
    whole.id = "whole";
    const SplitRun full = Run(whole, /*offer_prompt=*/false);
    EXPECT_EQ(full.cached_blocks, 0);
    EXPECT_EQ(full.out.tokens, reference.at(cases.front().id).tokens);
    EXPECT_GT(decode_->stats().prefix_hit_tokens, 0);
  }

  std::unique_ptr<Engine> prefill_;
  std::unique_ptr<Engine> decode_;
  std::unique_ptr<TcpKvReceiver> receiver_;
  std::thread loop_;
  std::atomic<bool> stop_{false};
  uint64_t next_transfer_ = 1;
  std::vector<std::vector<int32_t>> fed_;
};

TEST_F(DisaggregationPrefixTest, SecondTurnsMoveOnlyNewBlocksWithSameTokens) {
  StartPair();
  CheckSecondTurns();
}

// On a device runner the cached blocks live in the device pool and the host
// copies are poisoned: only the received blocks may be copied in.
TEST_F(DisaggregationPrefixTest, DeviceRunnerCopiesOnlyTheReceivedBlocks) {
  auto control = std::make_shared<ShadowRunnerControl>();
  StartPair(ShadowRunner::Factory(control));
  CheckSecondTurns();
  EXPECT_GT(control->tables_copied_to_device.load(), 0);
}

// The cached blocks belong to the prompt ReserveImport was given: a Decode
// for another prompt of the same length is refused, and the reservation
// (with its pinned blocks) is freed by Cancel.
TEST_F(DisaggregationPrefixTest, DecodeOfAnotherPromptIsRefused) {
  StartPair();
  Case first;
  first.id = "a";
  first.prompt = Chat(Repeat("Describe the sea at night. ", 4));
  first.params.max_tokens = 4;
  first.params.temperature = 0.0;
  const SplitRun turn1 = Run(first, /*offer_prompt=*/true);
  ASSERT_TRUE(turn1.out.done);
  ImportOptions import =
      Import(99, static_cast<int64_t>(first.prompt.size()), 4);
  import.prompt = first.prompt;
  auto reservation = decode_->ReserveImport("b", import);
  ASSERT_TRUE(reservation.ok()) << reservation.status();
  ASSERT_GT(reservation->cached_blocks, 0);
  // Land a full transfer of another prompt of the same length.
  std::vector<int32_t> other = first.prompt;
  other[3] = other[3] == 42 ? 43 : 42;
  PrefillOptions options;
  options.make_sink = TcpKvSinkFactory(receiver_->endpoint(), 99);
  options.first_block = reservation->cached_blocks;
  PrefillResult prefill;
  SamplingParams params = first.params;
  ASSERT_TRUE(prefill_
                  ->SubmitPrefill({"b", other, params}, options,
                                  CollectPrefill(&prefill))
                  .ok());
  prefill_->RunUntilIdle();
  ASSERT_TRUE(prefill.done && prefill.last.error.ok()) << prefill.last.error;
  params.seed = prefill.seed;
  absl::Mutex mu;
  Outcome out;
  const absl::Status s = decode_->StartImportedDecode(
      {"b", other, params}, {prefill.first->token}, Collect(&out, &mu));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("differ from those of the prompt"));
  decode_->Cancel("b");
  // A first_block past the prompt's last block is refused by name.
  PrefillOptions bad;
  bad.make_sink = TcpKvSinkFactory(receiver_->endpoint(), 100);
  bad.first_block = static_cast<int64_t>(first.prompt.size() + 15) / 16;
  const absl::Status refused = prefill_->SubmitPrefill(
      {"c", first.prompt, first.params}, bad, CollectPrefill(&prefill));
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("first_block"));
}

}  // namespace
}  // namespace baton::disagg_test
