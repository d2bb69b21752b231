// Fixtures shared by the disaggregation tests: engines on the default model,
// a TCP receiver wired to a decode engine, sinks that fail or stall, and
// collectors for prefill and decode outputs.
#ifndef BATON_WORKER_ENGINE_DISAGGREGATION_TEST_UTIL_H_
#define BATON_WORKER_ENGINE_DISAGGREGATION_TEST_UTIL_H_

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/default_model_test_base.h"
#include "worker/engine/engine.h"
#include "worker/engine/kv_sink.h"
#include "worker/transport/tcp_kv_transport.h"

namespace baton::disagg_test {

using ::testing::HasSubstr;

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<std::optional<float>> logprobs;
  std::string text;
  FinishReason reason = FinishReason::kNone;
  absl::Status error;
  bool done = false;
};

struct PrefillResult {
  std::optional<TokenOutput> first;
  uint64_t seed = 0;
  PrefillOutput last;
  bool done = false;
};

inline ImportOptions Import(uint64_t transfer_id, int64_t prompt, int64_t max) {
  ImportOptions options;
  options.transfer_id = transfer_id;
  options.num_prompt_tokens = prompt;
  options.max_tokens = max;
  return options;
}

struct Case {
  std::string id;
  std::vector<int32_t> prompt;
  SamplingParams params;
};

// Fails layer `fail_at` (after aborting the transport underneath).
class FailingSink : public KvSink {
 public:
  FailingSink(std::unique_ptr<KvSink> inner, int64_t fail_at)
      : inner_(std::move(inner)), fail_at_(fail_at) {}
  absl::Status SendLayer(int64_t layer,
                         std::span<const uint8_t> bytes) override {
    if (layer == fail_at_) {
      return absl::InternalError(
          absl::StrCat("injected sink failure at layer ", layer));
    }
    return inner_->SendLayer(layer, bytes);
  }
  absl::Status Finish() override { return inner_->Finish(); }
  void Abort(absl::Status reason) override { inner_->Abort(reason); }

 private:
  std::unique_ptr<KvSink> inner_;
  int64_t fail_at_;
};

// Never confirms: Finish blocks until released.
class StuckSink : public KvSink {
 public:
  explicit StuckSink(absl::Notification* release) : release_(release) {}
  absl::Status SendLayer(int64_t, std::span<const uint8_t>) override {
    return absl::OkStatus();
  }
  absl::Status Finish() override {
    release_->WaitForNotification();
    return absl::OkStatus();
  }
  void Abort(absl::Status) override {}

 private:
  absl::Notification* release_;
};

// How RunDisaggregated moves the KV: Start(prefill, decode) before the
// first request, a sink per transfer, Stop() before the engines go.
class SplitTransport {
 public:
  virtual ~SplitTransport() = default;
  virtual void Start(Engine& prefill, Engine& decode) = 0;
  virtual KvSinkFactory Sink(uint64_t transfer_id) = 0;
  virtual void Stop() = 0;
  // PrefillOptions::sink_reads_device_pool for every request.
  virtual bool reads_device_pool() const { return false; }
};

// Host TCP (TcpKvReceiver on 127.0.0.1, TcpKvSinkFactory).
class TcpSplitTransport : public SplitTransport {
 public:
  void Start(Engine&, Engine& decode) override {
    auto receiver = TcpKvReceiver::Start({}, decode.ImportCallbacks());
    ASSERT_TRUE(receiver.ok()) << receiver.status();
    receiver_ = std::move(*receiver);
  }
  KvSinkFactory Sink(uint64_t transfer_id) override {
    return TcpKvSinkFactory(receiver_->endpoint(), transfer_id);
  }
  void Stop() override { receiver_.reset(); }

 private:
  std::unique_ptr<TcpKvReceiver> receiver_;
};

class DisaggregationTest : public testing::DefaultModelTest {
 protected:
  static std::unique_ptr<Engine> MakeEngine(
      int64_t budget = 512, int64_t block_size = 16, int64_t blocks = 256,
      ForwardRunnerFactory make_runner = nullptr) {
    EngineOptions options;
    options.make_runner = std::move(make_runner);
    options.num_threads = 2;
    options.block_size = block_size;
    options.kv_cache_blocks = blocks;
    options.scheduler.max_num_batched_tokens = budget;
    auto engine = Engine::Create(options, weights_, tokenizer_);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return std::move(*engine);
  }

  static std::unique_ptr<TcpKvReceiver> StartReceiver(Engine& decode) {
    auto receiver = TcpKvReceiver::Start({}, decode.ImportCallbacks());
    EXPECT_TRUE(receiver.ok()) << receiver.status();
    return std::move(*receiver);
  }

  static void ExpectAllFree(Engine& engine) {
    const EngineStats s = engine.stats();
    EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
    EXPECT_EQ(s.num_imports, 0);
    EXPECT_EQ(s.num_handoffs, 0);
    EXPECT_EQ(s.kv_staging_blocks_used, 0);
    EXPECT_TRUE(engine.kv_cache().CheckInvariants().ok());
  }

  static std::vector<int32_t> Chat(const std::string& user) {
    return tokenizer_->Encode("<|im_start|>user\n" + user +
                              "<|im_end|>\n<|im_start|>assistant\n");
  }

  static OutputCallback Collect(Outcome* out, absl::Mutex* mu) {
    return [out, mu](const RequestOutput& o) {
      absl::MutexLock lock(mu);
      for (const TokenOutput& t : o.tokens) {
        out->tokens.push_back(t.token);
        out->logprobs.push_back(t.logprob);
      }
      out->text += o.text;
      out->reason = o.finish_reason;
      out->error = o.error;
      if (o.finish_reason != FinishReason::kNone) out->done = true;
    };
  }

  static PrefillCallback CollectPrefill(PrefillResult* out) {
    return [out](const PrefillOutput& o) {
      if (o.first_token.has_value()) {
        out->first = o.first_token;
        out->seed = o.seed;
      }
      if (o.done) {
        out->last = o;
        out->done = true;
      }
    };
  }

  // Eight prompts of different lengths (about 15 to 400 tokens), greedy and
  // seeded sampling, stop strings on some.
  static std::vector<Case> Cases() {
    const std::vector<std::string> users = {
        "Hi",
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "List three colors, separated by commas.",
        "Explain in one sentence why the sky is blue.",
        "Count from one to twenty in words.",
        "Summarize: " + Repeat("The river runs past the old mill. ", 12),
        "Continue the story: " +
            Repeat("A fox met a crow who held some cheese. ", 36),
    };
    std::vector<Case> cases;
    for (size_t i = 0; i < users.size(); ++i) {
      Case c;
      c.id = "r" + std::to_string(i);
      c.prompt = Chat(users[i]);
      c.params.max_tokens = 24;
      if (i % 2 == 1) {
        c.params.temperature = 0.8;
        c.params.top_p = 0.9;
        c.params.seed = 1000 + i;
      } else {
        c.params.temperature = 0.0;
      }
      if (i % 3 == 0) c.params.stop = {",", "."};
      if (i == 2) c.params.logprobs = 2;
      cases.push_back(std::move(c));
    }
    return cases;
  }

  static std::string Repeat(const std::string& s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
  }

  static std::map<std::string, Outcome> RunColocated(
      const std::vector<Case>& cases,
      const ForwardRunnerFactory& make_runner = nullptr) {
    auto engine = MakeEngine(512, 16, 256, make_runner);
    absl::Mutex mu;
    std::map<std::string, Outcome> results;
    for (const Case& c : cases) {
      EXPECT_TRUE(
          engine
              ->Submit({c.id, c.prompt, c.params}, Collect(&results[c.id], &mu))
              .ok());
    }
    engine->RunUntilIdle();
    ExpectAllFree(*engine);
    return results;
  }

  // Prefill engine -> TCP on 127.0.0.1 -> decode engine stepping on its own
  // thread. Returns the full token stream (first token + decode tokens).
  // Both engines run on make_runner's runners (null: the CPU runner); the
  // KV moves over `transport` (null: host TCP).
  static std::map<std::string, Outcome> RunDisaggregated(
      const std::vector<Case>& cases, int64_t prefill_budget,
      const ForwardRunnerFactory& make_runner = nullptr,
      SplitTransport* transport = nullptr) {
    auto prefill = MakeEngine(prefill_budget, 16, 256, make_runner);
    auto decode = MakeEngine(512, 16, 256, make_runner);
    TcpSplitTransport tcp;
    if (transport == nullptr) transport = &tcp;
    transport->Start(*prefill, *decode);
    absl::Mutex mu;
    std::map<std::string, Outcome> results;
    std::map<std::string, PrefillResult> prefills;
    for (const Case& c : cases) results[c.id];
    std::atomic<bool> stop{false};
    std::thread decode_loop([&] {
      while (!stop.load()) {
        if (!decode->Step())
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
    uint64_t transfer_id = 1;
    for (const Case& c : cases) {
      ImportOptions import;
      import.transfer_id = transfer_id;
      import.num_prompt_tokens = static_cast<int64_t>(c.prompt.size());
      import.max_tokens = c.params.max_tokens;
      auto reservation = decode->ReserveImport(c.id, import);
      EXPECT_TRUE(reservation.ok()) << reservation.status();
      PrefillOptions options;
      options.make_sink = transport->Sink(transfer_id);
      options.sink_reads_device_pool = transport->reads_device_pool();
      PrefillCallback collect = CollectPrefill(&prefills[c.id]);
      // Starts the decode as soon as the handoff is confirmed.
      auto on_prefill = [&, c, collect](const PrefillOutput& o) {
        collect(o);
        if (!o.done) return;
        ASSERT_TRUE(o.error.ok()) << o.error;
        const PrefillResult& p = prefills[c.id];
        ASSERT_TRUE(p.first.has_value());
        if (c.params.seed.has_value()) {
          EXPECT_EQ(p.seed, *c.params.seed);
        }
        SamplingParams params = c.params;
        params.seed = p.seed;
        {
          absl::MutexLock lock(&mu);
          results[c.id].tokens.push_back(p.first->token);
          results[c.id].logprobs.push_back(p.first->logprob);
        }
        EXPECT_TRUE(decode
                        ->StartImportedDecode({c.id, c.prompt, params},
                                              {p.first->token},
                                              Collect(&results[c.id], &mu))
                        .ok());
        std::printf(
            "  %s: prompt %zu tokens, KV %llu bytes, transfer %.2f ms, "
            "after last layer %.2f ms\n",
            c.id.c_str(), c.prompt.size(),
            static_cast<unsigned long long>(o.handoff.kv_bytes),
            o.handoff.transfer_s * 1e3, o.handoff.tail_s * 1e3);
      };
      EXPECT_TRUE(
          prefill
              ->SubmitPrefill({c.id, c.prompt, c.params}, options, on_prefill)
              .ok());
      ++transfer_id;
    }
    prefill->RunUntilIdle();
    const auto deadline = Clock::now() + std::chrono::seconds(120);
    while (Clock::now() < deadline) {
      absl::MutexLock lock(&mu);
      bool all = true;
      for (auto& [id, r] : results) all = all && r.done;
      if (all) break;
      mu.AwaitWithTimeout(absl::Condition::kTrue, absl::Milliseconds(5));
    }
    stop = true;
    decode_loop.join();
    transport->Stop();
    for (auto& [id, r] : results) EXPECT_TRUE(r.done) << id << " never ended";
    ExpectAllFree(*prefill);
    ExpectAllFree(*decode);
    return results;
  }

  static void ExpectSame(const std::map<std::string, Outcome>& a,
                         const std::map<std::string, Outcome>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [id, ra] : a) {
      const Outcome& rb = b.at(id);
      EXPECT_EQ(ra.tokens, rb.tokens) << id;
      EXPECT_EQ(ra.logprobs, rb.logprobs) << id;
      EXPECT_EQ(ra.text, rb.text) << id;
      EXPECT_EQ(ra.reason, rb.reason) << id;
      EXPECT_FALSE(ra.tokens.empty()) << id;
    }
  }
};

}  // namespace baton::disagg_test

#endif  // BATON_WORKER_ENGINE_DISAGGREGATION_TEST_UTIL_H_
