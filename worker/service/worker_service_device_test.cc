// GPU workers' KV routing through WorkerService: a decode worker with a
// device-direct receiver offers it next to its TCP endpoint in ReserveKv,
// and a prefill worker on the same device sends over it straight from its
// device pool; on another device it falls back to TCP with host staging.
// Devices are ShadowRunners and the CUDA IPC transport runs over
// FakeCudaIpcApi, so this runs without a GPU.
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/cuda_ipc_handoff.h"
#include "worker/engine/shadow_runner_test_util.h"
#include "worker/service/worker_service.h"
#include "worker/service/worker_service_test_fixture.h"
#include "worker/transport/cuda_ipc_fake_api.h"

namespace baton::worker_service_test {
namespace {

using ::baton::testing::ShadowRunner;
using ::baton::testing::ShadowRunnerControl;

class WorkerServiceDeviceTest : public WorkerServiceTest {
 protected:
  // A worker whose engine runs on a ShadowRunner ("device" `kv_device`),
  // wired for CUDA IPC through the shared fake API.
  std::unique_ptr<TestWorker> StartDeviceWorker(
      v1::WorkerRole role, const std::string& kv_device,
      std::shared_ptr<ShadowRunnerControl> control) {
    return StartWorker(
        role, ShadowRunner::Factory(std::move(control)),
        [this, kv_device](Engine& engine, WorkerServiceOptions& options) {
          api_.RegisterAllocation(0, engine.device_kv_pool(),
                                  engine.kv_cache().pool_bytes());
          options.kv_device = kv_device;
          options.start_device_receiver =
              [this](Engine* e) -> absl::StatusOr<std::unique_ptr<KvReceiver>> {
            auto receiver =
                CudaIpcKvReceiver::Start(&api_, {}, CudaIpcImportCallbacks(e));
            if (!receiver.ok()) return receiver.status();
            return std::unique_ptr<KvReceiver>(std::move(*receiver));
          };
          options.make_device_sink = [this](
                                         const std::string& address,
                                         uint64_t transfer_id,
                                         const std::string& model_id,
                                         const std::string& transfer_secret) {
            CudaIpcKvSenderOptions sender_options;
            sender_options.transfer_secret = transfer_secret;
            return CudaIpcKvSinkFactory(mappings_.get(), address, transfer_id,
                                        model_id, sender_options);
          };
        });
  }

  void SetUp() override {
    auto mappings = CudaIpcPeerMappings::Create(&api_, 0);
    ASSERT_TRUE(mappings.ok()) << mappings.status();
    mappings_ = std::move(*mappings);
  }

  // A prefill worker on `prefill_gpu`, a decode worker on `decode_gpu`, one
  // request split across them: the tokens of the in-process engine, and
  // every block free afterwards on both.
  void RunSplit(const std::string& prefill_gpu, const std::string& decode_gpu) {
    prefill_ = StartDeviceWorker(v1::WORKER_ROLE_PREFILL, prefill_gpu,
                                 prefill_device_);
    decode_ =
        StartDeviceWorker(v1::WORKER_ROLE_DECODE, decode_gpu, decode_device_);
    ASSERT_NE(prefill_, nullptr);
    ASSERT_NE(decode_, nullptr);
    const std::vector<int32_t> prompt = Prompt("Name three colors.");
    EXPECT_EQ(
        Split(*prefill_, *decode_, "split", prompt, &reserved_, &transport_),
        Reference(prompt).tokens);
    for (TestWorker* w : {prefill_.get(), decode_.get()}) {
      const v1::WorkerLoad load = w->WaitAllFree();
      EXPECT_EQ(load.kv_blocks_free(), load.kv_blocks_total());
    }
  }

  FakeCudaIpcApi api_;
  std::unique_ptr<CudaIpcPeerMappings> mappings_;
  std::shared_ptr<ShadowRunnerControl> prefill_device_ =
      std::make_shared<ShadowRunnerControl>();
  std::shared_ptr<ShadowRunnerControl> decode_device_ =
      std::make_shared<ShadowRunnerControl>();
  std::unique_ptr<TestWorker> prefill_, decode_;
  v1::ReserveKvResponse reserved_;
  v1::KvTransport transport_ = v1::KV_TRANSPORT_UNSPECIFIED;  // reported
};

TEST_F(WorkerServiceDeviceTest, SameDeviceSendsDeviceToDevice) {
  RunSplit("host/gpu-0", "host/gpu-0");
  EXPECT_EQ(transport_, v1::KV_TRANSPORT_CUDA_IPC);
  EXPECT_EQ(reserved_.endpoint().transport(), v1::KV_TRANSPORT_HOST_TCP);
  ASSERT_EQ(reserved_.alternatives_size(), 1);
  EXPECT_EQ(reserved_.alternatives(0).transport(), v1::KV_TRANSPORT_CUDA_IPC);
  EXPECT_EQ(reserved_.alternatives(0).device(), "host/gpu-0");
  EXPECT_EQ(reserved_.alternatives(0).address(),
            decode_->service->device_kv_endpoint());
  EXPECT_GT(api_.bytes_copied(), 0u);
  EXPECT_EQ(prefill_device_->table_layers_copied_to_host, 0);
  EXPECT_EQ(decode_device_->tables_copied_to_device, 0);
}

TEST_F(WorkerServiceDeviceTest, OtherDeviceFallsBackToStagedTcp) {
  RunSplit("host/gpu-1", "host/gpu-0");
  EXPECT_EQ(transport_, v1::KV_TRANSPORT_HOST_TCP);
  EXPECT_EQ(api_.bytes_copied(), 0u);
  EXPECT_EQ(prefill_device_->table_layers_copied_to_host,
            weights_->config().num_layers);
  EXPECT_EQ(decode_device_->tables_copied_to_device, 1);
}

}  // namespace
}  // namespace baton::worker_service_test
