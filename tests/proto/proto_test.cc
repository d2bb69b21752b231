// The baton.v1 contracts: messages round-trip through the wire format, and
// the generated gRPC code serves and calls a Baton service in process (with
// the callback API the coordinator and workers use), alongside the standard
// health service and server reflection.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "baton/v1/api.grpc.pb.h"
#include "baton/v1/kv.pb.h"
#include "baton/v1/worker.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::ElementsAre;

constexpr int kTokensToStream = 3;

v1::GenerateRequest MakeRequest() {
  v1::GenerateRequest request;
  request.set_request_id("req-1");
  request.set_text("Hello, Baton");
  v1::SamplingParams* s = request.mutable_sampling();
  s->set_temperature(0.7);
  s->set_top_k(40);
  s->set_top_p(0.9);
  s->set_min_p(0.05);
  s->set_repetition_penalty(1.1);
  s->set_frequency_penalty(-0.5);
  s->set_presence_penalty(0.25);
  s->set_seed(0xFFFF'FFFF'FFFF'FFF0ull);
  s->set_max_tokens(kTokensToStream);
  s->add_stop("\n\n");
  s->add_stop_token_ids(2);
  s->set_ignore_eos(true);
  s->set_logprobs(0);
  return request;
}

TEST(ProtoMessages, GenerateRequestRoundTrips) {
  const v1::GenerateRequest request = MakeRequest();
  std::string bytes;
  ASSERT_TRUE(request.SerializeToString(&bytes));
  v1::GenerateRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  EXPECT_EQ(parsed.prompt_case(), v1::GenerateRequest::kText);
  EXPECT_EQ(parsed.text(), "Hello, Baton");
  EXPECT_EQ(parsed.sampling().seed(), 0xFFFF'FFFF'FFFF'FFF0ull);
  EXPECT_DOUBLE_EQ(parsed.sampling().temperature(), 0.7);
  EXPECT_EQ(parsed.sampling().top_k(), 40);
  EXPECT_THAT(parsed.sampling().stop(), ElementsAre("\n\n"));
  EXPECT_THAT(parsed.sampling().stop_token_ids(), ElementsAre(2));
  // Explicit presence: logprobs = 0 (chosen token only) differs from unset.
  EXPECT_TRUE(parsed.sampling().has_logprobs());
  EXPECT_EQ(parsed.sampling().logprobs(), 0);
  EXPECT_EQ(parsed.SerializeAsString(), bytes);

  // Unset optional fields stay unset (their defaults are not zero).
  v1::SamplingParams defaults;
  ASSERT_TRUE(
      defaults.ParseFromString(v1::SamplingParams().SerializeAsString()));
  EXPECT_FALSE(defaults.has_temperature());
  EXPECT_FALSE(defaults.has_max_tokens());
  EXPECT_FALSE(defaults.has_seed());
}

TEST(ProtoMessages, FinalResponseRoundTrips) {
  v1::GenerateResponse response;
  response.add_token_ids(7);
  response.set_text("!");
  v1::TokenLogprobs* lp = response.add_logprobs();
  lp->set_token_id(7);
  lp->set_logprob(-0.25f);
  v1::TokenLogprob* alt = lp->add_top_logprobs();
  alt->set_token_id(9);
  alt->set_logprob(-1.5f);
  v1::GenerateResult* result = response.mutable_result();
  result->set_finish_reason(v1::FINISH_REASON_LENGTH);
  result->mutable_usage()->set_prompt_tokens(5);
  result->mutable_usage()->set_completion_tokens(3);
  result->mutable_timings()->set_kv_transfer_bytes(int64_t{1} << 40);
  result->mutable_timings()->set_ttft_ms(12.5);
  result->mutable_prefill_worker()->set_worker_id("p0");
  result->mutable_decode_worker()->set_address("127.0.0.1:5001");
  result->set_stop_string("\n\n");

  v1::GenerateResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(response.SerializeAsString()));
  ASSERT_TRUE(parsed.has_result());
  EXPECT_EQ(parsed.result().finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(parsed.result().usage().completion_tokens(), 3);
  EXPECT_EQ(parsed.result().timings().kv_transfer_bytes(), int64_t{1} << 40);
  EXPECT_DOUBLE_EQ(parsed.result().timings().ttft_ms(), 12.5);
  EXPECT_EQ(parsed.result().prefill_worker().worker_id(), "p0");
  EXPECT_EQ(parsed.result().decode_worker().address(), "127.0.0.1:5001");
  EXPECT_EQ(parsed.result().matched_stop_case(),
            v1::GenerateResult::kStopString);
  ASSERT_EQ(parsed.logprobs_size(), 1);
  EXPECT_TRUE(parsed.logprobs(0).has_logprob());
  EXPECT_FLOAT_EQ(parsed.logprobs(0).logprob(), -0.25f);
  EXPECT_EQ(parsed.logprobs(0).top_logprobs(0).token_id(), 9);
}

TEST(ProtoMessages, KvFrameRoundTrips) {
  v1::KvFrame frame;
  v1::KvChunkHeader* h = frame.mutable_chunk();
  h->set_transfer_id("t-1");
  h->set_layer_index(29);
  h->set_block_count(8);
  h->set_payload_bytes(8 * 12288);
  h->set_checksum_type(v1::CHECKSUM_TYPE_XXH3_64);
  h->set_checksum(0x0123456789ABCDEFull);
  h->mutable_kv_layout()->set_num_layers(30);
  h->mutable_kv_layout()->set_dtype(v1::KV_DTYPE_F16);
  const std::string bytes = frame.SerializeAsString();
  // A header must fit the raw-TCP frame limit with a lot of room to spare.
  EXPECT_LT(bytes.size(), 256u);
  v1::KvFrame parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  ASSERT_EQ(parsed.frame_case(), v1::KvFrame::kChunk);
  EXPECT_EQ(parsed.chunk().checksum(), 0x0123456789ABCDEFull);
  EXPECT_EQ(parsed.chunk().kv_layout().num_layers(), 30);
}

// Streams kTokensToStream token messages (token ids 100, 101, ...), then a
// final message; one write in flight at a time.
class GenerateReactor final
    : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  explicit GenerateReactor(const v1::GenerateRequest& request)
      : request_id_(request.request_id()) {
    if (request.prompt_case() == v1::GenerateRequest::PROMPT_NOT_SET) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "prompt: one of text, token_ids, chat is required"));
      return;
    }
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
      return;
    }
    if (sent_ > kTokensToStream) {
      Finish(grpc::Status::OK);
      return;
    }
    WriteNext();
  }

  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    response_.Clear();
    if (sent_ == 0) response_.set_request_id(request_id_);
    if (sent_ < kTokensToStream) {
      response_.add_token_ids(100 + sent_);
      response_.set_text("t" + std::to_string(sent_));
    } else {
      response_.set_request_id(request_id_);
      v1::GenerateResult* result = response_.mutable_result();
      result->set_finish_reason(v1::FINISH_REASON_LENGTH);
      result->mutable_usage()->set_completion_tokens(kTokensToStream);
    }
    ++sent_;
    StartWrite(&response_);
  }

  const std::string request_id_;
  v1::GenerateResponse response_;  // must outlive the write
  int sent_ = 0;
};

class FakeBaton final : public v1::Baton::CallbackService {
 public:
  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* /*context*/,
      const v1::GenerateRequest* request) override {
    return new GenerateReactor(*request);
  }

  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override {
    for (unsigned char c : request->text()) response->add_token_ids(c);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

class InProcessServer : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Baton::NewStub(channel_);
  }

  void TearDown() override {
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(500));
  }

  static std::unique_ptr<grpc::ClientContext> ContextWithDeadline() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() +
                          std::chrono::seconds(5));
    return context;
  }

  FakeBaton service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Baton::Stub> stub_;
};

TEST_F(InProcessServer, GenerateStreamsTokensThenResult) {
  auto context = ContextWithDeadline();
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub_->Generate(context.get(), MakeRequest());
  std::vector<int32_t> tokens;
  std::string text;
  int results = 0;
  std::string first_request_id;
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    if (first_request_id.empty()) first_request_id = response.request_id();
    EXPECT_EQ(results, 0) << "message after the final one";
    for (int32_t t : response.token_ids()) tokens.push_back(t);
    text += response.text();
    if (response.has_result()) {
      ++results;
      EXPECT_EQ(response.result().finish_reason(), v1::FINISH_REASON_LENGTH);
      EXPECT_EQ(response.result().usage().completion_tokens(), kTokensToStream);
    }
  }
  const grpc::Status status = reader->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_THAT(tokens, ElementsAre(100, 101, 102));
  EXPECT_EQ(text, "t0t1t2");
  EXPECT_EQ(results, 1);
  EXPECT_EQ(first_request_id, "req-1");
}

TEST_F(InProcessServer, GenerateWithoutPromptFailsBeforeStreaming) {
  v1::GenerateRequest request = MakeRequest();
  request.clear_prompt();
  auto context = ContextWithDeadline();
  auto reader = stub_->Generate(context.get(), request);
  v1::GenerateResponse response;
  EXPECT_FALSE(reader->Read(&response));
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("prompt"));
}

// The callback client API, as the coordinator calls workers.
class GenerateClientReactor final
    : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  GenerateClientReactor(v1::Baton::Stub* stub,
                        const v1::GenerateRequest& request) {
    context_.set_deadline(std::chrono::system_clock::now() +
                          std::chrono::seconds(5));
    stub->async()->Generate(&context_, &request, this);
    StartRead(&response_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows with the status.
    for (int32_t t : response_.token_ids()) tokens_.push_back(t);
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
    done_ = true;
    cv_.notify_all();
  }

  // Waits for OnDone; false on timeout.
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(5), [&] { return done_; });
  }

  const grpc::Status& status() const { return status_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  grpc::ClientContext context_;
  v1::GenerateResponse response_;
  std::vector<int32_t> tokens_;  // written by OnReadDone, read after Wait
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  grpc::Status status_;
};

TEST_F(InProcessServer, CallbackClientReadsTheStream) {
  GenerateClientReactor reactor(stub_.get(), MakeRequest());
  ASSERT_TRUE(reactor.Wait());
  ASSERT_TRUE(reactor.status().ok()) << reactor.status().error_message();
  EXPECT_THAT(reactor.tokens(), ElementsAre(100, 101, 102));
}

TEST_F(InProcessServer, UnaryCallbackMethod) {
  v1::TokenizeRequest request;
  request.set_text("ab");
  v1::TokenizeResponse response;
  auto context = ContextWithDeadline();
  const grpc::Status status =
      stub_->Tokenize(context.get(), request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_THAT(response.token_ids(), ElementsAre('a', 'b'));
}

TEST_F(InProcessServer, UnimplementedMethodIsUnimplemented) {
  v1::ListModelsResponse response;
  auto context = ContextWithDeadline();
  const grpc::Status status =
      stub_->ListModels(context.get(), v1::ListModelsRequest(), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

// grpc.health.v1.Health/Check, called without its generated stub (Debian
// ships no health.proto): an empty HealthCheckRequest (service "", the
// whole server) is zero bytes, and HealthCheckResponse{status: SERVING(1)}
// is field 1 varint 1, i.e. bytes 0x08 0x01.
TEST_F(InProcessServer, HealthServiceAnswersServing) {
  ASSERT_NE(server_->GetHealthCheckService(), nullptr);
  grpc::GenericStub generic(channel_);
  // A default-constructed ByteBuffer holds no buffer at all and sending it
  // aborts (API misuse); an empty message is one empty slice.
  grpc::Slice empty;
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  auto context = ContextWithDeadline();
  std::promise<grpc::Status> done;
  generic.UnaryCall(context.get(), "/grpc.health.v1.Health/Check",
                    grpc::StubOptions(), &request, &response,
                    [&done](grpc::Status s) { done.set_value(std::move(s)); });
  std::future<grpc::Status> result = done.get_future();
  ASSERT_EQ(result.wait_for(std::chrono::seconds(5)),
            std::future_status::ready);
  const grpc::Status status = result.get();
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
}

}  // namespace
}  // namespace baton
