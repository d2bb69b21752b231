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
          options.make_device_sink = [this](const std::string& address,
                                            uint64_t transfer_id,
                                            const std::string& model_id) {
            return CudaIpcKvSinkFactory(mappings_.get(), address, transfer_id,
                                        model_id);
          };
        });
  }

  void SetUp() override {
    auto mappings = CudaIpcPeerMappings::Create(&api_, 0);
    ASSERT_TRUE(mappings.ok()) << mappings.status();
    mappings_ = std::move(*mappings);
  }

  FakeCudaIpcApi api_;
  std::unique_ptr<CudaIpcPeerMappings> mappings_;
};

TEST_F(WorkerServiceDeviceTest, SameDeviceSendsDeviceToDevice) {
  auto prefill_device = std::make_shared<ShadowRunnerControl>();
  auto decode_device = std::make_shared<ShadowRunnerControl>();
  auto prefill =
      StartDeviceWorker(v1::WORKER_ROLE_PREFILL, "host/gpu-0", prefill_device);
  auto decode =
      StartDeviceWorker(v1::WORKER_ROLE_DECODE, "host/gpu-0", decode_device);
  ASSERT_NE(prefill, nullptr);
  ASSERT_NE(decode, nullptr);
  const std::vector<int32_t> prompt = Prompt("Name three colors.");
  v1::ReserveKvResponse reserved;
  EXPECT_EQ(Split(*prefill, *decode, "gpu-split", prompt, &reserved),
            Reference(prompt).tokens);
  EXPECT_EQ(reserved.endpoint().transport(), v1::KV_TRANSPORT_HOST_TCP);
  ASSERT_EQ(reserved.alternatives_size(), 1);
  EXPECT_EQ(reserved.alternatives(0).transport(), v1::KV_TRANSPORT_CUDA_IPC);
  EXPECT_EQ(reserved.alternatives(0).device(), "host/gpu-0");
  EXPECT_EQ(reserved.alternatives(0).address(),
            decode->service->device_kv_endpoint());
  EXPECT_GT(api_.bytes_copied(), 0u);
  EXPECT_EQ(prefill_device->table_layers_copied_to_host, 0);
  EXPECT_EQ(decode_device->tables_copied_to_device, 0);
  const v1::WorkerLoad p = prefill->WaitAllFree();
  const v1::WorkerLoad d = decode->WaitAllFree();
  EXPECT_EQ(p.kv_blocks_free(), p.kv_blocks_total());
  EXPECT_EQ(d.kv_blocks_free(), d.kv_blocks_total());
}

TEST_F(WorkerServiceDeviceTest, OtherDeviceFallsBackToStagedTcp) {
  auto prefill_device = std::make_shared<ShadowRunnerControl>();
  auto decode_device = std::make_shared<ShadowRunnerControl>();
  auto prefill =
      StartDeviceWorker(v1::WORKER_ROLE_PREFILL, "host/gpu-1", prefill_device);
  auto decode =
      StartDeviceWorker(v1::WORKER_ROLE_DECODE, "host/gpu-0", decode_device);
  ASSERT_NE(prefill, nullptr);
  ASSERT_NE(decode, nullptr);
  const std::vector<int32_t> prompt = Prompt("Name three colors.");
  v1::ReserveKvResponse reserved;
  EXPECT_EQ(Split(*prefill, *decode, "tcp-split", prompt, &reserved),
            Reference(prompt).tokens);
  EXPECT_EQ(api_.bytes_copied(), 0u);
  EXPECT_EQ(prefill_device->table_layers_copied_to_host,
            weights_->config().num_layers);
  EXPECT_EQ(decode_device->tables_copied_to_device, 1);
  const v1::WorkerLoad d = decode->WaitAllFree();
  EXPECT_EQ(d.kv_blocks_free(), d.kv_blocks_total());
}

}  // namespace
}  // namespace baton::worker_service_test
