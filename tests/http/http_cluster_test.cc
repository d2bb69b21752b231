// baton-coordinator's OpenAI-compatible HTTP API on a real 1P1D cluster
// (LocalCluster with --http_listen=127.0.0.1:0): the official openai SDK,
// curl on the SSE stream, 64 concurrent streams, slow and disconnecting
// clients, bad input, and the prefix cache's usage figures and reset
// (tests/http/openai_check.py does the client side). Afterwards every worker
// has all its KV blocks free.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cluster/local_cluster.h"

namespace baton::testing {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;

class HttpClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string python = PythonPath();
    ASSERT_FALSE(python.empty())
        << "BATON_PYTHON is not set (run through ctest)";
    ASSERT_EQ(access(python.c_str(), X_OK), 0)
        << "no python at " << python << " (run scripts/setup.sh)";
    script_ = SourceDir() + "/tests/http/openai_check.py";
    ASSERT_EQ(access(script_.c_str(), R_OK), 0) << "missing " << script_;
  }

  void StartCluster(int64_t decode_kv_cache_mib = 0) {
    LocalClusterOptions options;
    options.http = true;
    options.kv_cache_mib = 256;
    options.decode_kv_cache_mib = decode_kv_cache_mib;
    auto cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
    ASSERT_FALSE(cluster_->http_address().empty());
  }

  // Runs openai_check.py MODE against the cluster; its stderr shows in the
  // test log.
  void RunScript(const std::string& mode) {
    auto out = RunCommand(absl::StrCat(PythonPath(), " ", script_, " ", mode,
                                       " ", cluster_->http_address()));
    ASSERT_TRUE(out.ok()) << "openai_check.py " << mode
                          << " failed (its message is above): " << out.status();
  }

  std::string ModelId() {
    grpc::ClientContext context;
    v1::ListModelsResponse models;
    grpc::Status rpc = cluster_->baton().ListModels(
        &context, v1::ListModelsRequest(), &models);
    EXPECT_TRUE(rpc.ok()) << rpc.error_message();
    return models.models_size() > 0 ? models.models(0).id() : "";
  }

  std::string Curl(const std::string& args) {
    auto out = RunCommand(absl::StrCat("curl -sS --max-time 60 ", args));
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *out : "";
  }

  // POSTs `body` to `path`; returns the response body, a space and the
  // HTTP status.
  std::string Post(const std::string& path, const Json& body) {
    const std::string file = ::testing::TempDir() + "/http_cluster_body.json";
    std::ofstream(file) << body.dump();
    return Curl(absl::StrCat("-w ' %{http_code}' http://",
                             cluster_->http_address(), path,
                             " -H 'Content-Type: application/json' "
                             "--data-binary @",
                             file));
  }

  std::string script_;
  std::unique_ptr<LocalCluster> cluster_;
};

// Splits Post's answer into its JSON and its status.
std::pair<Json, std::string> Answer(const std::string& posted) {
  const size_t space = posted.rfind(' ');
  if (space == std::string::npos) return {Json(), posted};
  return {Json::parse(posted.substr(0, space), nullptr, false),
          posted.substr(space + 1)};
}

TEST_F(HttpClusterTest, OpenAiSdkAndBadInput) {
  StartCluster();
  RunScript("sdk");
  RunScript("bad");
  EXPECT_TRUE(cluster_->WaitAllFree(absl::Seconds(10)).ok());
}

TEST_F(HttpClusterTest, CurlReadsTheSseStreamAndHealthAndMetrics) {
  StartCluster();
  const std::string url = "http://" + cluster_->http_address();
  const Json body = {
      {"model", ModelId()},
      {"messages", {{{"role", "user"}, {"content", "Name a fruit."}}}},
      {"max_tokens", 8},
      {"ignore_eos", true},
      {"stream", true},
      {"stream_options", {{"include_usage", true}}}};
  const std::string sse = Curl(
      absl::StrCat("-N ", url, "/v1/chat/completions -H ",
                   "'Content-Type: application/json' -d '", body.dump(), "'"));
  ASSERT_THAT(sse, HasSubstr("data: [DONE]\n\n"));
  std::vector<std::string> events = absl::StrSplit(sse, "\n\n");
  ASSERT_EQ(events.back(), "");  // the stream ends with a blank line
  events.pop_back();
  ASSERT_GE(events.size(), 4u);  // role, content..., finish, usage, [DONE]
  EXPECT_EQ(events.back(), "data: [DONE]");
  std::string text;
  int usage_chunks = 0;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    SCOPED_TRACE(events[i]);
    ASSERT_EQ(events[i].rfind("data: ", 0), 0u);
    const Json chunk = Json::parse(events[i].substr(6), nullptr, false);
    ASSERT_FALSE(chunk.is_discarded());
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    if (!chunk["usage"].is_null()) {
      ++usage_chunks;
      EXPECT_EQ(chunk["usage"]["completion_tokens"], 8);
      continue;
    }
    const Json& delta = chunk["choices"][0]["delta"];
    if (delta.contains("content")) text += delta["content"].get<std::string>();
  }
  EXPECT_EQ(usage_chunks, 1);
  EXPECT_FALSE(text.empty());

  EXPECT_THAT(Curl(absl::StrCat("-w ' %{http_code}' ", url, "/health")),
              HasSubstr("\"status\":\"ok\"} 200"));
  const std::string metrics = Curl(absl::StrCat("-i ", url, "/metrics"));
  EXPECT_THAT(metrics, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_THAT(metrics, HasSubstr("# TYPE baton_"));
  EXPECT_TRUE(cluster_->WaitAllFree(absl::Seconds(10)).ok());

  // Without a decode worker the cluster cannot serve: 503.
  cluster_->Kill(1);
  std::string health;
  // Until the coordinator has seen the worker go (its lease ends).
  for (int i = 0; i < 600; ++i) {
    health = Curl(absl::StrCat("-w ' %{http_code}' ", url, "/health"));
    if (absl::EndsWith(health, " 503")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_THAT(health, HasSubstr("\"status\":\"unavailable\"")) << health;
  EXPECT_THAT(health, HasSubstr(" 503"));
}

// A decode pool of 11 blocks (176 tokens): a chat that sets no max_tokens
// gets what the pool holds after its prompt (not the 1024-token default,
// which could never be served); an explicit max_tokens beyond it is a 400
// naming what fits, and so is a chat longer than the model's context.
TEST_F(HttpClusterTest, ChatWithoutMaxTokensGetsWhatTheDecodePoolHolds) {
  StartCluster(/*decode_kv_cache_mib=*/4);
  std::string words;
  for (int i = 0; i < 60; ++i) absl::StrAppend(&words, " apple pear");
  Json body = {{"model", ModelId()},
               {"messages", {{{"role", "user"}, {"content", words}}}},
               {"ignore_eos", true}};
  auto [fits, status] = Answer(Post("/v1/chat/completions", body));
  ASSERT_EQ(status, "200") << fits.dump();
  const int prompt = fits["usage"]["prompt_tokens"].get<int>();
  ASSERT_LT(prompt, 176);
  EXPECT_EQ(fits["usage"]["completion_tokens"].get<int>(), 176 - prompt);
  EXPECT_EQ(fits["choices"][0]["finish_reason"], "length");

  body["max_tokens"] = 500;
  auto [too_many, status_too_many] = Answer(Post("/v1/chat/completions", body));
  EXPECT_EQ(status_too_many, "400") << too_many.dump();
  EXPECT_THAT(too_many["error"]["message"].get<std::string>(),
              HasSubstr(absl::StrCat("max_tokens <= ", 176 - prompt,
                                     " fits this prompt")));

  body.erase("max_tokens");
  std::string long_chat;
  for (int i = 0; i < 4200; ++i) absl::StrAppend(&long_chat, " apple pear");
  body["messages"][0]["content"] = long_chat;
  auto [too_long, status_too_long] = Answer(Post("/v1/chat/completions", body));
  EXPECT_EQ(status_too_long, "400") << too_long.dump();
  EXPECT_EQ(too_long["error"]["param"], "messages");
  EXPECT_THAT(too_long["error"]["message"].get<std::string>(),
              HasSubstr("the model's context holds 8192"));
  EXPECT_TRUE(cluster_->WaitAllFree(absl::Seconds(10)).ok());
}

// The same prompt twice: the second prefill reuses the first one's full
// blocks (usage.prompt_tokens_details.cached_tokens) and answers the same;
// POST /reset_prefix_cache empties every worker's cache.
TEST_F(HttpClusterTest, PrefixCacheHitsShowInUsageAndResetClearsThem) {
  StartCluster();
  const std::string url = "http://" + cluster_->http_address();
  const Json body = {
      {"model", ModelId()},
      {"messages",
       {{{"role", "system"},
         {"content",
          "You are a careful assistant. You answer in one sentence, you "
          "name your sources, and you never repeat the question back."}},
        {{"role", "user"}, {"content", "Name a fruit that is yellow."}}}},
      {"max_tokens", 6},
      {"temperature", 0}};
  auto chat = [&] {
    const Json r =
        Json::parse(Curl(absl::StrCat(url, "/v1/chat/completions -H ",
                                      "'Content-Type: application/json' -d '",
                                      body.dump(), "'")),
                    nullptr, false);
    EXPECT_FALSE(r.is_discarded());
    EXPECT_TRUE(r.contains("usage")) << r.dump();
    return r;
  };
  const Json first = chat();
  const Json second = chat();
  const int prompt_tokens = first["usage"]["prompt_tokens"].get<int>();
  ASSERT_GT(prompt_tokens, 32) << first.dump();
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  // Every full block before the one holding the last prompt token.
  EXPECT_EQ(second["usage"]["prompt_tokens_details"]["cached_tokens"],
            (prompt_tokens - 1) / 16 * 16)
      << second.dump();
  EXPECT_EQ(second["choices"][0]["message"]["content"],
            first["choices"][0]["message"]["content"]);

  EXPECT_THAT(
      Curl(absl::StrCat("-w ' %{http_code}' ", url, "/reset_prefix_cache")),
      HasSubstr(" 405"));
  const std::string reset = Curl(
      absl::StrCat("-X POST -w ' %{http_code}' ", url, "/reset_prefix_cache"));
  ASSERT_TRUE(absl::EndsWith(reset, " 200")) << reset;
  const Json reply =
      Json::parse(reset.substr(0, reset.size() - 4), nullptr, false);
  ASSERT_FALSE(reply.is_discarded()) << reset;
  EXPECT_EQ(reply["workers_reset"], 2);
  EXPECT_GT(reply["blocks_dropped"].get<int64_t>(), 0);
  EXPECT_EQ(reply["failed_workers"], Json::array());
  const Json third = chat();
  EXPECT_EQ(third["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(third["choices"][0]["message"]["content"],
            first["choices"][0]["message"]["content"]);
  EXPECT_TRUE(cluster_->WaitAllFree(absl::Seconds(10)).ok());
}

TEST_F(HttpClusterTest, SixtyFourConcurrentStreams) {
  StartCluster();
  RunScript("concurrent");
  EXPECT_TRUE(cluster_->WaitAllFree(absl::Seconds(10)).ok());
  // The HTTP API shuts down cleanly with the coordinator.
  absl::Status stopped = cluster_->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

TEST_F(HttpClusterTest, SlowAndDisconnectingClientsStallNobody) {
  StartCluster();
  RunScript("slow");
  // The disconnected stream asked for 3000 tokens: only its cancellation
  // frees its blocks this soon.
  absl::Status free = cluster_->WaitAllFree(absl::Seconds(5));
  EXPECT_TRUE(free.ok()) << free;
}

}  // namespace
}  // namespace baton::testing
