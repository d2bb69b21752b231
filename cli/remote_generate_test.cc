#include "cli/remote_generate.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "baton/v1/api.grpc.pb.h"
#include "cli/remote_generate_test_harness.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::cli {
namespace {

using remote_generate_test::FakeServer;
using remote_generate_test::GenerateHandler;
using remote_generate_test::Json;
using remote_generate_test::Options;
using remote_generate_test::ParseLines;
using remote_generate_test::StopResult;
using remote_generate_test::TwoTokens;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(RemoteGenerateTest, SendsChatAndEverySamplingField) {
  FakeServer server(TwoTokens);
  RemoteGenerateOptions o = Options(server);
  o.model_id = "smollm2";
  SamplingParams& s = o.generate.sampling;
  s.temperature = 0.7;
  s.top_k = 40;
  s.top_p = 0.9;
  s.min_p = 0.05;
  s.repetition_penalty = 1.1;
  s.frequency_penalty = 0.5;
  s.presence_penalty = -0.25;
  s.seed = 1234;
  s.max_tokens = 7;
  s.stop = {"\n\n", "END"};
  s.ignore_eos = true;
  s.logprobs = 3;
  o.generate.json = true;
  std::ostringstream out, err;
  ASSERT_TRUE(RunRemoteGenerate(o, out, err).ok()) << err.str();

  const auto requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  const v1::GenerateRequest& r = requests[0];
  EXPECT_EQ(r.model(), "smollm2");
  ASSERT_EQ(r.prompt_case(), v1::GenerateRequest::kChat);
  ASSERT_EQ(r.chat().messages_size(), 1);
  EXPECT_EQ(r.chat().messages(0).role(), "user");
  EXPECT_EQ(r.chat().messages(0).content(), "Hello");
  const v1::SamplingParams& p = r.sampling();
  EXPECT_DOUBLE_EQ(p.temperature(), 0.7);
  EXPECT_EQ(p.top_k(), 40);
  EXPECT_DOUBLE_EQ(p.top_p(), 0.9);
  EXPECT_DOUBLE_EQ(p.min_p(), 0.05);
  EXPECT_DOUBLE_EQ(p.repetition_penalty(), 1.1);
  EXPECT_DOUBLE_EQ(p.frequency_penalty(), 0.5);
  EXPECT_DOUBLE_EQ(p.presence_penalty(), -0.25);
  ASSERT_TRUE(p.has_seed());
  EXPECT_EQ(p.seed(), 1234u);
  EXPECT_EQ(p.max_tokens(), 7);
  EXPECT_THAT(p.stop(), ElementsAre("\n\n", "END"));
  EXPECT_TRUE(p.ignore_eos());
  ASSERT_TRUE(p.has_logprobs());
  EXPECT_EQ(p.logprobs(), 3);
  EXPECT_EQ(p.show_probs(), 0);
}

TEST(RemoteGenerateTest, RawSendsTextAndLeavesUnsetFieldsUnset) {
  FakeServer server(TwoTokens);
  RemoteGenerateOptions o = Options(server);
  o.generate.raw = true;
  o.generate.show_probs = true;
  o.generate.json = true;
  std::ostringstream out, err;
  ASSERT_TRUE(RunRemoteGenerate(o, out, err).ok());
  const auto requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  ASSERT_EQ(requests[0].prompt_case(), v1::GenerateRequest::kText);
  EXPECT_EQ(requests[0].text(), "Hello");
  EXPECT_FALSE(requests[0].sampling().has_seed());
  EXPECT_FALSE(requests[0].sampling().has_logprobs());
  EXPECT_EQ(requests[0].sampling().show_probs(), kShowProbsCandidates);

  const std::vector<Json> lines = ParseLines(out.str());
  ASSERT_EQ(lines.size(), 1u);
  ASSERT_EQ(lines[0]["logprobs"].size(), 2u);
  EXPECT_EQ(lines[0]["logprobs"][0]["probs"][0]["token"], 10);
  EXPECT_FLOAT_EQ(lines[0]["logprobs"][0]["probs"][0]["prob"].get<float>(),
                  0.75f);
  EXPECT_FALSE(lines[0]["logprobs"][0].contains("top_logprobs"));
}

TEST(RemoteGenerateTest, JsonHasLocalFieldsTimingsAndWorkers) {
  FakeServer server(TwoTokens);
  RemoteGenerateOptions o = Options(server);
  o.generate.sampling.logprobs = 1;
  o.generate.json = true;
  std::ostringstream out, err;
  ASSERT_TRUE(RunRemoteGenerate(o, out, err).ok());
  const std::vector<Json> lines = ParseLines(out.str());
  ASSERT_EQ(lines.size(), 1u);
  const Json& j = lines[0];
  EXPECT_EQ(j["token_ids"], Json({10, 11}));
  EXPECT_EQ(j["text"], "Hi there");
  EXPECT_EQ(j["finish_reason"], "stop");
  EXPECT_FALSE(j.contains("error"));
  EXPECT_EQ(j["prompt_tokens"], 9);
  EXPECT_DOUBLE_EQ(j["ttft_ms"].get<double>(), 12.5);
  EXPECT_DOUBLE_EQ(j["decode_tokens_per_s"].get<double>(), 40.0);
  EXPECT_EQ(j["request_id"], "r-1");
  EXPECT_EQ(j["seed"], 42);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 9);
  EXPECT_EQ(j["usage"]["completion_tokens"], 2);
  const Json& t = j["timings"];
  EXPECT_DOUBLE_EQ(t["queue_ms"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(t["prefill_ms"].get<double>(), 8.25);
  EXPECT_EQ(t["kv_transfer_bytes"], 4096);
  EXPECT_DOUBLE_EQ(t["kv_transfer_ms"].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(t["kv_transfer_exposed_ms"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(t["ttft_ms"].get<double>(), 12.5);
  EXPECT_DOUBLE_EQ(t["decode_tokens_per_s"].get<double>(), 40.0);
  EXPECT_DOUBLE_EQ(t["total_ms"].get<double>(), 37.5);
  EXPECT_EQ(j["prefill_worker"], "p-1");
  EXPECT_EQ(j["decode_worker"], "d-1");
  EXPECT_EQ(j["kv_transport"], "host_tcp");
  EXPECT_EQ(j["stop_string"], "END");
  ASSERT_EQ(j["logprobs"].size(), 2u);
  EXPECT_EQ(j["logprobs"][0]["token"], 10);
  EXPECT_FLOAT_EQ(j["logprobs"][0]["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(j["logprobs"][0]["top_logprobs"][0]["token"], 10);
  EXPECT_FLOAT_EQ(j["logprobs"][1]["logprob"].get<float>(), -1.25f);
  EXPECT_FALSE(j["logprobs"][0].contains("piece"));
  EXPECT_FALSE(j["logprobs"][0].contains("probs"));
}

TEST(RemoteGenerateTest, StreamsTextThenSummaryOnStderr) {
  FakeServer server(TwoTokens);
  RemoteGenerateOptions o = Options(server);
  std::ostringstream out, err;
  ASSERT_TRUE(RunRemoteGenerate(o, out, err).ok());
  EXPECT_EQ(out.str(), "Hi there\n");
  EXPECT_THAT(err.str(), HasSubstr("[9 prompt tokens, 2 generated, finish: "
                                   "stop] TTFT 12.5 ms, decode 40.0"));
  EXPECT_THAT(err.str(), HasSubstr("prefill 8.2 ms"));
  EXPECT_THAT(err.str(), HasSubstr("KV 4096 bytes in 3.0 ms (0.8 ms exposed"));
  EXPECT_THAT(err.str(), HasSubstr("prefill worker p-1 (10.0.0.1:7001)"));
  EXPECT_THAT(err.str(), HasSubstr("decode worker d-1 (10.0.0.2:7002)"));
}

TEST(RemoteGenerateTest, ShowProbsStreamsOneLinePerToken) {
  FakeServer server(TwoTokens);
  RemoteGenerateOptions o = Options(server);
  o.generate.show_probs = true;
  std::ostringstream out, err;
  ASSERT_TRUE(RunRemoteGenerate(o, out, err).ok());
  const std::string text = out.str();
  EXPECT_THAT(text, HasSubstr("\"Hi\""));
  EXPECT_THAT(text, HasSubstr("#10 0.7500"));
  EXPECT_THAT(text, HasSubstr("\" there\""));
  // One line per token plus the final newline.
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 3);
}

TEST(RemoteGenerateTest, PromptsFileRunsConcurrentlyAndPrintsInInputOrder) {
  constexpr int kPrompts = 4;
  absl::Mutex mu;
  int arrived = 0;
  std::vector<int> finish_order;
  FakeServer server([&](grpc::ServerContext*, const v1::GenerateRequest& req,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) {
    const int index = std::stoi(req.text().substr(1));
    {
      absl::MutexLock lock(&mu);
      ++arrived;
      // Every stream is open before any answers: the client sent them all
      // (a client that waits for an answer before the next send hangs here).
      auto all = [&]() { return arrived == kPrompts; };
      mu.Await(absl::Condition(&all));
      // The last prompt answers first: each waits for the one after it.
      auto turn = [&]() {
        return finish_order.size() == static_cast<size_t>(kPrompts - 1 - index);
      };
      mu.Await(absl::Condition(&turn));
    }
    v1::GenerateResponse response;
    response.set_request_id("r" + std::to_string(index));
    response.add_token_ids(100 + index);
    response.set_text("answer " + std::to_string(index));
    *response.mutable_result() = StopResult();
    writer->Write(response);
    absl::MutexLock lock(&mu);
    finish_order.push_back(index);
    return grpc::Status::OK;
  });
  const std::string path =
      ::testing::TempDir() + "/remote_generate_prompts.txt";
  {
    std::ofstream file(path);
    for (int i = 0; i < kPrompts; ++i) file << "p" << i << "\n\n";
  }
  RemoteGenerateOptions o = Options(server);
  o.generate.prompt.clear();
  o.generate.prompts_file = path;
  o.generate.raw = true;
  std::ostringstream out, err;
  const absl::Status status = RunRemoteGenerate(o, out, err);
  ASSERT_TRUE(status.ok()) << status;
  const std::vector<Json> lines = ParseLines(out.str());
  ASSERT_EQ(lines.size(), static_cast<size_t>(kPrompts));
  for (int i = 0; i < kPrompts; ++i) {
    EXPECT_EQ(lines[i]["text"], "answer " + std::to_string(i));
    EXPECT_EQ(lines[i]["token_ids"], Json({100 + i}));
    EXPECT_EQ(lines[i]["request_id"], "r" + std::to_string(i));
  }
  absl::MutexLock lock(&mu);
  EXPECT_THAT(finish_order, ElementsAre(3, 2, 1, 0));
  std::remove(path.c_str());
}

TEST(RemoteGenerateTest, RpcErrorBeforeFirstMessageIsReturnedAsIs) {
  FakeServer server([](grpc::ServerContext*, const v1::GenerateRequest&,
                       grpc::ServerWriter<v1::GenerateResponse>*) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "no healthy decode worker");
  });
  RemoteGenerateOptions o = Options(server);
  std::ostringstream out, err;
  const absl::Status status = RunRemoteGenerate(o, out, err);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(status.ToString(), "UNAVAILABLE: no healthy decode worker");
  EXPECT_EQ(out.str(), "");

  o.generate.json = true;
  std::ostringstream json_out;
  EXPECT_EQ(RunRemoteGenerate(o, json_out, err).code(),
            absl::StatusCode::kUnavailable);
  const std::vector<Json> lines = ParseLines(json_out.str());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["finish_reason"], "error");
  EXPECT_EQ(lines[0]["error_code"], "UNAVAILABLE");
  EXPECT_EQ(lines[0]["error_message"], "no healthy decode worker");
}

TEST(RemoteGenerateTest, InBandErrorIsFinishReasonError) {
  FakeServer server([](grpc::ServerContext*, const v1::GenerateRequest&,
                       grpc::ServerWriter<v1::GenerateResponse>* writer) {
    v1::GenerateResponse first;
    first.set_request_id("r-9");
    first.add_token_ids(5);
    first.set_text("Par");
    writer->Write(first);
    v1::GenerateResponse last;
    last.mutable_result()->set_finish_reason(v1::FINISH_REASON_ERROR);
    last.mutable_result()->set_error_code(
        static_cast<int32_t>(grpc::StatusCode::UNAVAILABLE));
    last.mutable_result()->set_error_message("decode worker d-1 went down");
    writer->Write(last);
    return grpc::Status::OK;
  });
  RemoteGenerateOptions o = Options(server);
  o.generate.json = true;
  std::ostringstream out, err;
  const absl::Status status = RunRemoteGenerate(o, out, err);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("decode worker d-1 went down"));
  const std::vector<Json> lines = ParseLines(out.str());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["finish_reason"], "error");
  EXPECT_EQ(lines[0]["error_code"], "UNAVAILABLE");
  EXPECT_EQ(lines[0]["error_message"], "decode worker d-1 went down");
  EXPECT_EQ(lines[0]["text"], "Par");
  EXPECT_EQ(lines[0]["request_id"], "r-9");

  // Streaming: the partial text, then the error.
  o.generate.json = false;
  std::ostringstream text_out;
  EXPECT_EQ(RunRemoteGenerate(o, text_out, err).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(text_out.str(), "Par\n");
}

// Sends one token, then holds the stream open until the client cancels it
// (a deadline counts), then notifies `cancelled`. The sync API has no
// cancellation callback, so it polls.
GenerateHandler HoldOpen(absl::Notification* cancelled) {
  return [cancelled](grpc::ServerContext* context, const v1::GenerateRequest&,
                     grpc::ServerWriter<v1::GenerateResponse>* writer) {
    v1::GenerateResponse first;
    first.add_token_ids(1);
    first.set_text("Once");
    writer->Write(first);
    while (!context->IsCancelled()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    cancelled->Notify();
    return grpc::Status::OK;
  };
}

// A string buffer that notifies `flushed` at its first flush; streamed text
// is flushed as each message arrives.
class FlushNotifyingBuf final : public std::stringbuf {
 public:
  absl::Notification flushed;

 protected:
  int sync() override {
    if (!flushed.HasBeenNotified()) flushed.Notify();
    return std::stringbuf::sync();
  }
};

TEST(RemoteGenerateTest, InterruptCancelsTheStream) {
  absl::Notification cancelled;
  std::atomic<bool> interrupted{false};
  FakeServer server(HoldOpen(&cancelled));
  RemoteGenerateOptions o = Options(server);
  // No deadline: only the interrupt can end the held stream.
  o.deadline_ms = 0;
  o.interrupted = &interrupted;
  FlushNotifyingBuf out_buf;
  std::ostream out(&out_buf);
  std::ostringstream err;
  absl::Status status;
  std::thread client([&] { status = RunRemoteGenerate(o, out, err); });
  out_buf.flushed.WaitForNotification();  // "Once" has been printed
  interrupted.store(true);
  client.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(status.message(), "interrupted");
  EXPECT_EQ(out_buf.str(), "Once\n");
  // The server side sees the cancellation.
  cancelled.WaitForNotification();
}

TEST(RemoteGenerateTest, DeadlineEndsTheStream) {
  absl::Notification cancelled;
  FakeServer server(HoldOpen(&cancelled));
  RemoteGenerateOptions o = Options(server);
  // HoldOpen never ends the stream itself: only the deadline can.
  o.deadline_ms = 200;
  std::ostringstream out, err;
  const absl::Status status = RunRemoteGenerate(o, out, err);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(RemoteGenerateTest, BadInputFailsBeforeAnyRpc) {
  FakeServer server(TwoTokens);
  RemoteGenerateOptions o = Options(server);
  o.generate.sampling.top_p = 1.5;
  std::ostringstream out, err;
  EXPECT_EQ(RunRemoteGenerate(o, out, err).code(),
            absl::StatusCode::kInvalidArgument);
  o = Options(server);
  o.server.clear();
  EXPECT_EQ(RunRemoteGenerate(o, out, err).code(),
            absl::StatusCode::kInvalidArgument);
  o = Options(server);
  o.generate.prompt.clear();
  EXPECT_EQ(RunRemoteGenerate(o, out, err).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(server.requests().empty());
}

TEST(GenerationJsonTest, PieceOnlyWithAPieceFunction) {
  GenerationRecord record;
  TokenOutput token;
  token.token = 7;
  token.logprob = -0.25f;
  record.tokens.push_back(token);
  record.text = "x";
  record.finish_reason = FinishReason::kLength;
  record.prompt_tokens = 3;
  record.ttft_ms = 2.0;
  const Json local = GenerationJson(
      record, [](int32_t t) { return "<" + std::to_string(t) + ">"; },
      /*logprobs=*/true, /*show_probs=*/false);
  EXPECT_EQ(local["logprobs"][0]["piece"], "<7>");
  EXPECT_EQ(local["finish_reason"], "length");
  EXPECT_EQ(local["prompt_tokens"], 3);
  const Json remote = GenerationJson(record, nullptr, true, false);
  EXPECT_FALSE(remote["logprobs"][0].contains("piece"));
  EXPECT_FALSE(
      GenerationJson(record, nullptr, false, false).contains("logprobs"));
}

}  // namespace
}  // namespace baton::cli
