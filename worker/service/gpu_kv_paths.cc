#include "worker/service/gpu_kv_paths.h"

#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/cuda/cuda_engine_runner.h"
#include "worker/engine/cuda_ipc_handoff.h"

ABSL_FLAG(int64_t, kv_host_staging_mib, 1024,
          "with --device=cuda:N: page-locked host memory in MiB for the KV "
          "that host transports (TCP) carry, at most the KV pool's size; a "
          "transfer beyond it stages in pageable memory of its own");

namespace baton {

absl::StatusOr<ForwardRunnerFactory> CudaRunnerFromFlags(int device) {
  const int64_t mib = absl::GetFlag(FLAGS_kv_host_staging_mib);
  if (mib < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_host_staging_mib must be >= 0, got ", mib));
  }
  CudaRunnerOptions cuda;
  cuda.device = device;
  cuda.host_staging_bytes = static_cast<uint64_t>(mib) << 20;
  return MakeCudaRunnerFactory(cuda);
}

absl::StatusOr<std::unique_ptr<GpuKvPaths>> GpuKvPaths::Create(
    Engine* engine, int device, const std::string& kv_host, v1::WorkerRole role,
    WorkerServiceOptions* options) {
  std::unique_ptr<GpuKvPaths> paths(new GpuKvPaths());
  BATON_ASSIGN_OR_RETURN(options->kv_device, CudaDeviceIdentity(device));

  // CUDA IPC: workers on this GPU (the sender picks it by kv_device).
  paths->ipc_api_ = CreateCudaIpcApi();
  BATON_ASSIGN_OR_RETURN(
      paths->ipc_mappings_,
      CudaIpcPeerMappings::Create(paths->ipc_api_.get(), device));
  CudaIpcKvReceiverOptions ipc_options;
  ipc_options.host = kv_host;
  ipc_options.device = device;
  options->start_device_receiver =
      [api = paths->ipc_api_.get(),
       ipc_options](Engine* e) -> absl::StatusOr<std::unique_ptr<KvReceiver>> {
    BATON_ASSIGN_OR_RETURN(
        std::unique_ptr<CudaIpcKvReceiver> receiver,
        CudaIpcKvReceiver::Start(api, ipc_options, CudaIpcImportCallbacks(e)));
    return std::unique_ptr<KvReceiver>(std::move(receiver));
  };
  options->make_device_sink =
      [mappings = paths->ipc_mappings_.get()](
          const std::string& address, uint64_t transfer_id,
          const std::string& model_id, const std::string& transfer_secret) {
        CudaIpcKvSenderOptions sender_options;
        sender_options.transfer_secret = transfer_secret;
        return CudaIpcKvSinkFactory(mappings, address, transfer_id, model_id,
                                    sender_options);
      };

  // NCCL: workers on other GPUs, paired through PairKv.
  paths->nccl_api_ = CreateCudaNcclApi();
  BATON_ASSIGN_OR_RETURN(paths->nccl_pool_,
                         NcclCommPool::Create(paths->nccl_api_.get()));
  if (role != v1::WORKER_ROLE_PREFILL) {
    BATON_ASSIGN_OR_RETURN(paths->nccl_receiver_,
                           NcclKvReceiver::Create(paths->nccl_pool_.get(), {},
                                                  NcclImportCallbacks(engine)));
    paths->nccl_pairing_ = std::make_unique<NcclPairing>(
        paths->nccl_pool_.get(), paths->nccl_receiver_.get(), device);
    options->expect_nccl = [pairing = paths->nccl_pairing_.get()](
                               const v1::PairKvRequest& request,
                               uint64_t transfer_id,
                               const std::string& decode_id) {
      return pairing->Expect(request, transfer_id, decode_id);
    };
  }
  // GpuKvPaths::Create runs after the control plane's credentials are set.
  options->make_nccl_sink = [pool = paths->nccl_pool_.get(), device,
                             credentials = options->peer_credentials](
                                const std::string& address,
                                const v1::PairKvRequest& pair,
                                const std::string& model_id) {
    return NcclKvSinkFactory(pool, device, address, pair, model_id,
                             credentials);
  };
  return paths;
}

void GpuKvPaths::StopReceiving() {
  nccl_pairing_.reset();
  nccl_receiver_.reset();
}

}  // namespace baton
