// WorkerService over loopback gRPC: a request split across a prefill and a
// decode worker (KV over TCP) and a colocated one give the tokens of a
// single in-process engine; Cancel frees every block; bad requests get the
// status codes of their errors.
#include "worker/service/worker_service.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/service/worker_service_test_fixture.h"
#include "worker/transport/kv_wire.h"

namespace baton::worker_service_test {
namespace {

using ::testing::HasSubstr;

TEST_F(WorkerServiceTest, SplitRequestMatchesInProcessEngine) {
  auto prefill = StartWorker(v1::WORKER_ROLE_PREFILL);
  auto decode = StartWorker(v1::WORKER_ROLE_DECODE);
  ASSERT_NE(prefill, nullptr);
  ASSERT_NE(decode, nullptr);
  const std::vector<int32_t> prompt = Prompt("Name three colors.");
  const Generated expected = Reference(prompt);
  ASSERT_EQ(expected.tokens.size(), static_cast<size_t>(kMaxTokens));

  v1::ReserveKvRequest reserve;
  reserve.set_request_id("split-1");
  reserve.set_model_id("smollm2");
  reserve.set_num_prompt_tokens(static_cast<int32_t>(prompt.size()));
  reserve.set_max_tokens(kMaxTokens);
  v1::ReserveKvResponse reserved;
  {
    auto context = Context();
    const grpc::Status status =
        decode->stub->ReserveKv(context.get(), reserve, &reserved);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  EXPECT_GT(reserved.blocks_reserved(), 0);
  EXPECT_EQ(reserved.endpoint().address(), decode->service->kv_endpoint());
  // The reservation's secret, which only the prefill worker it is handed to
  // can prove (kv_wire.h).
  EXPECT_EQ(reserved.transfer_secret().size(), kKvSecretBytes);

  v1::PrefillRequest request;
  request.set_request_id("split-1");
  request.set_model_id("smollm2");
  request.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  *request.mutable_sampling() = Greedy();
  *request.mutable_kv_target()->mutable_endpoint() = reserved.endpoint();
  request.mutable_kv_target()->set_transfer_id(reserved.transfer_id());
  request.mutable_kv_target()->set_transfer_secret(reserved.transfer_secret());
  int32_t first = -1;
  bool handoff = false;
  const grpc::Status prefilled =
      RunPrefill(*prefill, request, &first, &handoff);
  ASSERT_TRUE(prefilled.ok()) << prefilled.error_message();
  EXPECT_TRUE(handoff);
  EXPECT_EQ(first, expected.tokens[0]);

  v1::DecodeRequest decode_request;
  decode_request.set_request_id("split-1");
  decode_request.set_transfer_id(reserved.transfer_id());
  decode_request.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  *decode_request.mutable_sampling() = Greedy();
  decode_request.add_generated_token_ids(first);
  Generated rest;
  v1::DecodeResult result;
  const grpc::Status decoded =
      RunDecode(*decode, decode_request, &rest, &result);
  ASSERT_TRUE(decoded.ok()) << decoded.error_message();
  std::vector<int32_t> tokens = {first};
  tokens.insert(tokens.end(), rest.tokens.begin(), rest.tokens.end());
  EXPECT_EQ(tokens, expected.tokens);
  EXPECT_EQ(rest.text, expected.text);  // the whole text, first token's too
  EXPECT_EQ(result.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(result.decode_tokens(), kMaxTokens - 1);

  const v1::WorkerLoad p = prefill->WaitAllFree();
  const v1::WorkerLoad d = decode->WaitAllFree();
  EXPECT_EQ(p.kv_blocks_free(), p.kv_blocks_total());
  EXPECT_EQ(d.kv_blocks_free(), d.kv_blocks_total());
}

// Decode is called before the KV has landed: it waits for the transfer.
TEST_F(WorkerServiceTest, DecodeBeforeTransferWaitsForIt) {
  auto prefill = StartWorker(v1::WORKER_ROLE_PREFILL);
  auto decode = StartWorker(v1::WORKER_ROLE_DECODE);
  ASSERT_NE(prefill, nullptr);
  ASSERT_NE(decode, nullptr);
  const std::vector<int32_t> prompt = Prompt("Count to five.");
  const Generated expected = Reference(prompt);

  v1::ReserveKvRequest reserve;
  reserve.set_request_id("early-1");
  reserve.set_num_prompt_tokens(static_cast<int32_t>(prompt.size()));
  reserve.set_max_tokens(kMaxTokens);
  v1::ReserveKvResponse reserved;
  {
    auto context = Context();
    ASSERT_TRUE(
        decode->stub->ReserveKv(context.get(), reserve, &reserved).ok());
  }
  // The prefill's first token is known from the reference run, so Decode can
  // be sent before the prefill starts.
  v1::DecodeRequest decode_request;
  decode_request.set_request_id("early-1");
  decode_request.set_transfer_id(reserved.transfer_id());
  decode_request.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  *decode_request.mutable_sampling() = Greedy();
  decode_request.add_generated_token_ids(expected.tokens[0]);
  Generated rest;
  v1::DecodeResult result;
  grpc::Status decoded;
  std::thread decoder(
      [&] { decoded = RunDecode(*decode, decode_request, &rest, &result); });
  // The Decode call is leased once the service has taken it: wait for that
  // (not for a fixed time, which a loaded host can outlast).
  std::vector<std::string> leased;
  for (int i = 0; i < 6000 && leased.empty(); ++i) {
    leased = decode->service->LeasedRequestIds();
    if (leased.empty())
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_THAT(leased, ::testing::ElementsAre("early-1"));

  v1::PrefillRequest request;
  request.set_request_id("early-1");
  request.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  *request.mutable_sampling() = Greedy();
  *request.mutable_kv_target()->mutable_endpoint() = reserved.endpoint();
  request.mutable_kv_target()->set_transfer_id(reserved.transfer_id());
  request.mutable_kv_target()->set_transfer_secret(reserved.transfer_secret());
  int32_t first = -1;
  bool handoff = false;
  const grpc::Status prefilled =
      RunPrefill(*prefill, request, &first, &handoff);
  decoder.join();
  ASSERT_TRUE(prefilled.ok()) << prefilled.error_message();
  ASSERT_TRUE(decoded.ok()) << decoded.error_message();
  std::vector<int32_t> tokens = {first};
  tokens.insert(tokens.end(), rest.tokens.begin(), rest.tokens.end());
  EXPECT_EQ(tokens, expected.tokens);
  EXPECT_GT(result.kv_wait_ms(), 0.0);
  const v1::WorkerLoad d = decode->WaitAllFree();
  EXPECT_EQ(d.kv_blocks_free(), d.kv_blocks_total());
  EXPECT_TRUE(decode->service->LeasedRequestIds().empty());
}

// A transfer id nobody reserved: the prefill fails with the receiver's
// error and both workers keep every block.
TEST_F(WorkerServiceTest, PrefillToUnknownTransferFailsAndFrees) {
  auto prefill = StartWorker(v1::WORKER_ROLE_PREFILL);
  auto decode = StartWorker(v1::WORKER_ROLE_DECODE);
  ASSERT_NE(prefill, nullptr);
  ASSERT_NE(decode, nullptr);
  v1::PrefillRequest request;
  request.set_request_id("orphan-1");
  const std::vector<int32_t> prompt = Prompt("Hi.");
  request.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  *request.mutable_sampling() = Greedy();
  request.mutable_kv_target()->mutable_endpoint()->set_transport(
      v1::KV_TRANSPORT_HOST_TCP);
  request.mutable_kv_target()->mutable_endpoint()->set_address(
      decode->service->kv_endpoint());
  request.mutable_kv_target()->set_transfer_id("777");
  int32_t first = -1;
  bool handoff = false;
  const grpc::Status status = RunPrefill(*prefill, request, &first, &handoff);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND)
      << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("777"));
  EXPECT_FALSE(handoff);
  const v1::WorkerLoad p = prefill->WaitAllFree();
  EXPECT_EQ(p.kv_blocks_free(), p.kv_blocks_total());
  const v1::WorkerLoad d = decode->WaitAllFree();
  EXPECT_EQ(d.kv_blocks_free(), d.kv_blocks_total());
}

TEST_F(WorkerServiceTest, ColocatedRequestMatchesInProcessEngine) {
  auto both = StartWorker(v1::WORKER_ROLE_BOTH);
  ASSERT_NE(both, nullptr);
  const std::vector<int32_t> prompt = Prompt("Say hello.");
  const Generated expected = Reference(prompt);

  v1::PrefillRequest request;
  request.set_request_id("local-1");
  request.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  *request.mutable_sampling() = Greedy();
  int32_t first = -1;
  bool handoff = false;
  const grpc::Status prefilled = RunPrefill(*both, request, &first, &handoff);
  ASSERT_TRUE(prefilled.ok()) << prefilled.error_message();
  EXPECT_TRUE(handoff);
  EXPECT_EQ(first, expected.tokens[0]);

  v1::DecodeRequest decode_request;
  decode_request.set_request_id("local-1");
  decode_request.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  *decode_request.mutable_sampling() = Greedy();
  decode_request.add_generated_token_ids(first);
  Generated rest;
  v1::DecodeResult result;
  const grpc::Status decoded = RunDecode(*both, decode_request, &rest, &result);
  ASSERT_TRUE(decoded.ok()) << decoded.error_message();
  std::vector<int32_t> tokens = {first};
  tokens.insert(tokens.end(), rest.tokens.begin(), rest.tokens.end());
  EXPECT_EQ(tokens, expected.tokens);
  EXPECT_EQ(rest.text, expected.text);
  EXPECT_EQ(result.finish_reason(), v1::FINISH_REASON_LENGTH);
  const v1::WorkerLoad load = both->WaitAllFree();
  EXPECT_EQ(load.kv_blocks_free(), load.kv_blocks_total());
}

TEST_F(WorkerServiceTest, CancelFreesBlocks) {
  auto both = StartWorker(v1::WORKER_ROLE_BOTH);
  ASSERT_NE(both, nullptr);
  // A reservation whose transfer never comes.
  v1::ReserveKvRequest reserve;
  reserve.set_request_id("reserved-1");
  reserve.set_num_prompt_tokens(40);
  reserve.set_max_tokens(100);
  v1::ReserveKvResponse reserved;
  {
    auto context = Context();
    ASSERT_TRUE(both->stub->ReserveKv(context.get(), reserve, &reserved).ok());
  }
  v1::WorkerLoad load = both->Load();
  EXPECT_EQ(load.kv_blocks_free(),
            load.kv_blocks_total() - reserved.blocks_reserved());
  // A colocated request that would run long.
  v1::PrefillRequest request;
  request.set_request_id("long-1");
  const std::vector<int32_t> prompt = Prompt("Tell a long story.");
  request.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  *request.mutable_sampling() = Greedy(/*max_tokens=*/400);
  int32_t first = -1;
  bool handoff = false;
  ASSERT_TRUE(RunPrefill(*both, request, &first, &handoff).ok());
  EXPECT_LT(both->Load().kv_blocks_free(), load.kv_blocks_free());

  for (const char* id : {"reserved-1", "long-1"}) {
    v1::CancelRequest cancel;
    cancel.set_request_id(id);
    cancel.set_reason("test");
    v1::CancelResponse cancelled;
    auto context = Context();
    ASSERT_TRUE(both->stub->Cancel(context.get(), cancel, &cancelled).ok());
    EXPECT_TRUE(cancelled.found()) << id;
  }
  load = both->WaitAllFree();
  EXPECT_EQ(load.kv_blocks_free(), load.kv_blocks_total());
  // The heartbeat's queued prefill tokens drain with the requests.
  EXPECT_EQ(load.queued_prefill_tokens(), 0);
  // Idempotent: a second cancel of the same id is OK and finds nothing.
  v1::CancelRequest cancel;
  cancel.set_request_id("reserved-1");
  v1::CancelResponse cancelled;
  auto context = Context();
  ASSERT_TRUE(both->stub->Cancel(context.get(), cancel, &cancelled).ok());
  EXPECT_FALSE(cancelled.found());
  // The cancelled local request is gone: its Decode is NOT_FOUND.
  v1::DecodeRequest decode_request;
  decode_request.set_request_id("long-1");
  *decode_request.mutable_sampling() = Greedy();
  Generated rest;
  v1::DecodeResult result;
  EXPECT_EQ(RunDecode(*both, decode_request, &rest, &result).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

// A reservation whose transfer never starts is freed once its TTL passed,
// and only then.
TEST_F(WorkerServiceTest, ReservationExpiresWithoutItsTransfer) {
  auto decode = StartWorker(v1::WORKER_ROLE_DECODE);
  ASSERT_NE(decode, nullptr);
  v1::ReserveKvRequest reserve;
  reserve.set_request_id("ttl-1");
  reserve.set_num_prompt_tokens(40);
  reserve.set_max_tokens(10);
  reserve.set_reservation_ttl_ms(60000);
  v1::ReserveKvResponse reserved;
  {
    auto context = Context();
    ASSERT_TRUE(
        decode->stub->ReserveKv(context.get(), reserve, &reserved).ok());
  }
  ASSERT_GT(reserved.blocks_reserved(), 0);
  WorkerService& service = *decode->service;
  EXPECT_TRUE(service.ExpireReservations().empty());  // within its TTL
  EXPECT_EQ(service.LeasedRequestIds(), std::vector<std::string>{"ttl-1"});
  EXPECT_EQ(service.ExpireReservations(absl::Now() + absl::Seconds(61)),
            std::vector<std::string>{"ttl-1"});
  const v1::WorkerLoad load = decode->WaitAllFree();
  EXPECT_EQ(load.kv_blocks_free(), load.kv_blocks_total());
}

TEST_F(WorkerServiceTest, BadRequestsGetTheirStatusCodes) {
  auto both = StartWorker(v1::WORKER_ROLE_BOTH);
  ASSERT_NE(both, nullptr);
  v1::PrefillRequest request;
  request.set_request_id("bad-1");
  request.add_prompt_token_ids(1);
  *request.mutable_sampling() = Greedy();
  request.mutable_sampling()->set_temperature(-1.0);
  int32_t first = -1;
  bool handoff = false;
  grpc::Status status = RunPrefill(*both, request, &first, &handoff);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("temperature"));

  request.mutable_sampling()->set_temperature(0.0);
  request.mutable_sampling()->clear_seed();
  status = RunPrefill(*both, request, &first, &handoff);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("sampling.seed"));

  v1::DecodeRequest decode_request;
  decode_request.set_request_id("never-seen");
  *decode_request.mutable_sampling() = Greedy();
  decode_request.add_generated_token_ids(1);
  Generated rest;
  v1::DecodeResult result;
  status = RunDecode(*both, decode_request, &rest, &result);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("never-seen"));

  v1::ReserveKvRequest reserve;
  reserve.set_request_id("huge-1");
  reserve.set_num_prompt_tokens(64 * 16);
  reserve.set_max_tokens(16);
  v1::ReserveKvResponse reserved;
  auto context = Context();
  status = both->stub->ReserveKv(context.get(), reserve, &reserved);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  const v1::WorkerLoad load = both->WaitAllFree();
  EXPECT_EQ(load.kv_blocks_free(), load.kv_blocks_total());
}

}  // namespace
}  // namespace baton::worker_service_test
