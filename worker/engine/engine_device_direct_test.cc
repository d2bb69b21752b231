// A device-direct handoff: the prefill engine's sink reads the layers from
// its runner's device pool and the receiver writes the decode runner's
// device pool, with no host staging on either side. The CUDA IPC transport
// runs over FakeCudaIpcApi (device memory = the ShadowRunners' pools, which
// the host caches never mirror: they hold poison), so the tokens match a
// colocated run only if every byte went device to device.
#include <memory>
#include <utility>

#include "worker/engine/cuda_ipc_handoff.h"
#include "worker/engine/disaggregation_test_util.h"
#include "worker/engine/shadow_runner_test_util.h"
#include "worker/transport/cuda_ipc_fake_api.h"
#include "worker/transport/cuda_ipc_kv_transport.h"

namespace baton {
namespace {

using namespace ::baton::disagg_test;  // NOLINT(build/namespaces): fixtures
using ::baton::testing::ShadowRunner;
using ::baton::testing::ShadowRunnerControl;

class FakeCudaIpcSplitTransport : public SplitTransport {
 public:
  void Start(Engine& prefill, Engine& decode) override {
    api_.RegisterAllocation(0, decode.device_kv_pool(),
                            decode.kv_cache().pool_bytes());
    api_.RegisterAllocation(0, prefill.device_kv_pool(),
                            prefill.kv_cache().pool_bytes());
    auto mappings = CudaIpcPeerMappings::Create(&api_, 0);
    ASSERT_TRUE(mappings.ok()) << mappings.status();
    mappings_ = std::move(*mappings);
    auto receiver =
        CudaIpcKvReceiver::Start(&api_, {}, CudaIpcImportCallbacks(&decode));
    ASSERT_TRUE(receiver.ok()) << receiver.status();
    receiver_ = std::move(*receiver);
  }
  KvSinkFactory Sink(uint64_t transfer_id) override {
    return CudaIpcKvSinkFactory(mappings_.get(), receiver_->endpoint(),
                                transfer_id);
  }
  void Stop() override {
    receiver_.reset();
    mappings_.reset();
  }
  bool reads_device_pool() const override { return true; }

  const FakeCudaIpcApi& api() const { return api_; }

 private:
  FakeCudaIpcApi api_;
  std::unique_ptr<CudaIpcPeerMappings> mappings_;
  std::unique_ptr<CudaIpcKvReceiver> receiver_;
};

TEST_F(DisaggregationTest, DeviceToDeviceHandoffMatchesColocated) {
  std::vector<Case> cases = Cases();
  cases = {cases[0], cases[1], cases[6], cases[7]};
  auto prefill = std::make_shared<ShadowRunnerControl>();
  auto decode = std::make_shared<ShadowRunnerControl>();
  auto runners = [prefill, decode, next = std::make_shared<int>(0)](
                     const ModelWeights* w, KvCache* c, ThreadPool* p) {
    return ShadowRunner::Factory((*next)++ == 0 ? prefill : decode)(w, c, p);
  };
  FakeCudaIpcSplitTransport transport;
  const auto split = RunDisaggregated(cases, 512, runners, &transport);
  ExpectSame(RunColocated(cases), split);
  // No host staging on either side; every layer went over the fake device.
  EXPECT_EQ(prefill->table_layers_copied_to_host, 0);
  EXPECT_EQ(decode->tables_copied_to_device, 0);
  EXPECT_GT(transport.api().bytes_copied(), 0u);
}

}  // namespace
}  // namespace baton
