// GPU workers on different devices hand KV over NCCL through
// WorkerService: ReserveKv offers KV_TRANSPORT_NCCL, the prefill worker
// pairs with the decode worker (PairKv) when its handoff starts and sends
// from its device pool over the pair's communicator, which later requests
// reuse. Devices are ShadowRunners, NCCL a loopback NcclApi over host
// memory (nccl_kv_transport_test_harness.h), so this runs without a GPU.
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/shadow_runner_test_util.h"
#include "worker/service/nccl_pairing.h"
#include "worker/service/worker_service.h"
#include "worker/service/worker_service_test_fixture.h"
#include "worker/transport/nccl_kv_transport_test_harness.h"

namespace baton::worker_service_test {
namespace {

using ::baton::nccl_kv_test::LoopbackNcclApi;
using ::baton::testing::ShadowRunner;
using ::baton::testing::ShadowRunnerControl;
using ::testing::HasSubstr;

class WorkerServiceNcclTest : public WorkerServiceTest {
 protected:
  void SetUp() override {
    // Both ends join in this process at once; a pair whose peer never comes
    // (PairKvNamesWhatIsWrong's last one) gives up after this, not the
    // production default of 30 s.
    NcclCommPoolOptions options;
    options.init_timeout = absl::Seconds(3);
    for (auto* pool : {&prefill_pool_, &decode_pool_}) {
      auto created = NcclCommPool::Create(&api_, options);
      ASSERT_TRUE(created.ok()) << created.status();
      *pool = std::move(*created);
    }
  }
  void TearDown() override {
    pairing_.reset();
    receiver_.reset();
  }

  // Decode worker on "host/gpu-1" (device 1), prefill on "host/gpu-0".
  void StartWorkers() {
    prefill_ = StartWorker(
        v1::WORKER_ROLE_PREFILL, ShadowRunner::Factory(prefill_device_),
        [this](Engine&, WorkerServiceOptions& options) {
          options.kv_device = "host/gpu-0";
          options.make_nccl_sink = [this](const std::string& address,
                                          const v1::PairKvRequest& pair,
                                          const std::string& model_id) {
            return NcclKvSinkFactory(prefill_pool_.get(), 0, address, pair,
                                     model_id);
          };
        });
    decode_ = StartWorker(
        v1::WORKER_ROLE_DECODE, ShadowRunner::Factory(decode_device_),
        [this](Engine&, WorkerServiceOptions& options) {
          options.kv_device = "host/gpu-1";
          options.expect_nccl = [this](const v1::PairKvRequest& request,
                                       uint64_t transfer_id,
                                       const std::string& decode_id) {
            return pairing_->Expect(request, transfer_id, decode_id);
          };
        });
    ASSERT_NE(prefill_, nullptr);
    ASSERT_NE(decode_, nullptr);
    auto receiver = NcclKvReceiver::Create(
        decode_pool_.get(), {}, NcclImportCallbacks(decode_->engine.get()));
    ASSERT_TRUE(receiver.ok()) << receiver.status();
    receiver_ = std::move(*receiver);
    pairing_ =
        std::make_unique<NcclPairing>(decode_pool_.get(), receiver_.get(), 1);
  }

  LoopbackNcclApi api_;
  std::unique_ptr<NcclCommPool> prefill_pool_, decode_pool_;
  std::shared_ptr<ShadowRunnerControl> prefill_device_ =
      std::make_shared<ShadowRunnerControl>();
  std::shared_ptr<ShadowRunnerControl> decode_device_ =
      std::make_shared<ShadowRunnerControl>();
  std::unique_ptr<TestWorker> prefill_, decode_;
  std::unique_ptr<NcclKvReceiver> receiver_;
  std::unique_ptr<NcclPairing> pairing_;
};

TEST_F(WorkerServiceNcclTest, OtherDeviceSendsOverNcclAndReusesThePair) {
  StartWorkers();
  const std::vector<int32_t> prompt = Prompt("Name three colors.");
  const std::vector<int32_t> expected = Reference(prompt).tokens;
  v1::ReserveKvResponse reserved;
  v1::KvTransport transport = v1::KV_TRANSPORT_UNSPECIFIED;
  EXPECT_EQ(Split(*prefill_, *decode_, "nccl-1", prompt, &reserved, &transport),
            expected);
  EXPECT_EQ(transport, v1::KV_TRANSPORT_NCCL);
  ASSERT_EQ(reserved.alternatives_size(), 1);
  EXPECT_EQ(reserved.alternatives(0).transport(), v1::KV_TRANSPORT_NCCL);
  EXPECT_EQ(reserved.alternatives(0).device(), "host/gpu-1");
  EXPECT_EQ(reserved.alternatives(0).address(), decode_->address);
  // Straight from device pool to device pool: nothing staged.
  EXPECT_EQ(prefill_device_->table_layers_copied_to_host, 0);
  EXPECT_EQ(decode_device_->tables_copied_to_device, 0);
  const std::string key = prefill_->address + "/" + decode_->address;
  auto generation = decode_pool_->generation(key);
  ASSERT_TRUE(generation.ok()) << generation.status();
  EXPECT_EQ(*generation, 1u);
  // A second request reuses the pair's communicator.
  EXPECT_EQ(Split(*prefill_, *decode_, "nccl-2", prompt, &reserved), expected);
  EXPECT_EQ(*decode_pool_->generation(key), 1u);
  EXPECT_EQ(decode_pool_->num_pairs(), 1);
  const v1::WorkerLoad p = prefill_->WaitAllFree();
  const v1::WorkerLoad d = decode_->WaitAllFree();
  EXPECT_EQ(p.kv_blocks_free(), p.kv_blocks_total());
  EXPECT_EQ(d.kv_blocks_free(), d.kv_blocks_total());
}

TEST_F(WorkerServiceNcclTest, AbortedPairGetsANewGeneration) {
  StartWorkers();
  const std::vector<int32_t> prompt = Prompt("Name three colors.");
  const std::vector<int32_t> expected = Reference(prompt).tokens;
  v1::ReserveKvResponse reserved;
  EXPECT_EQ(Split(*prefill_, *decode_, "a", prompt, &reserved), expected);
  const std::string key = prefill_->address + "/" + decode_->address;
  // A stalled peer or timeout aborts the pair on both sides.
  decode_pool_->Abort(key, absl::DeadlineExceededError("peer stalled"));
  prefill_pool_->Abort(key, absl::DeadlineExceededError("peer stalled"));
  EXPECT_EQ(Split(*prefill_, *decode_, "b", prompt, &reserved), expected);
  EXPECT_EQ(*decode_pool_->generation(key), 2u);
}

TEST_F(WorkerServiceNcclTest, PairKvNamesWhatIsWrong) {
  StartWorkers();
  v1::PairKvRequest request;
  request.set_request_id("nobody");
  request.set_transfer_id("12");
  request.mutable_prefill_worker()->set_worker_id("w-1");
  v1::PairKvResponse response;
  auto context = Context();
  grpc::Status status =
      decode_->stub->PairKv(context.get(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("nobody"));
  request.set_transfer_id("x");
  context = Context();
  status = decode_->stub->PairKv(context.get(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  context = Context();
  status = prefill_->stub->PairKv(context.get(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  // A live reservation, quoted without its secret: no pair expects it.
  v1::ReserveKvRequest reserve;
  reserve.set_request_id("r-1");
  reserve.set_model_id("smollm2");
  reserve.set_num_prompt_tokens(8);
  reserve.set_max_tokens(kMaxTokens);
  v1::ReserveKvResponse reserved;
  context = Context();
  ASSERT_TRUE(decode_->stub->ReserveKv(context.get(), reserve, &reserved).ok());
  request.set_request_id("r-1");
  request.set_transfer_id(reserved.transfer_id());
  request.set_transfer_secret("a-guess");
  context = Context();
  status = decode_->stub->PairKv(context.get(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(status.error_message(), HasSubstr("transfer_secret"));
  request.set_transfer_secret(reserved.transfer_secret());
  context = Context();
  status = decode_->stub->PairKv(context.get(), request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

}  // namespace
}  // namespace baton::worker_service_test
