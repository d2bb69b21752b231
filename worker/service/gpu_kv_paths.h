// A GPU worker's wiring: its engine's CUDA runner (CudaRunnerFromFlags) and
// its device-direct KV paths, wired into WorkerServiceOptions: CUDA IPC with
// workers on the same GPU (cuda_ipc_handoff.h) and NCCL with workers on other
// GPUs or nodes (nccl_pairing.h). The TCP path stays for everything else.
// Built with BATON_CUDA.
#ifndef BATON_WORKER_SERVICE_GPU_KV_PATHS_H_
#define BATON_WORKER_SERVICE_GPU_KV_PATHS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/engine/engine.h"
#include "worker/service/nccl_pairing.h"
#include "worker/service/worker_service.h"
#include "worker/transport/cuda_ipc_api.h"
#include "worker/transport/cuda_ipc_kv_transport.h"
#include "worker/transport/nccl_kv_transport.h"

namespace baton {

// The engine's runner on CUDA device `device`, its host staging pool sized
// by --kv_host_staging_mib. InvalidArgument naming the flag if it is < 0.
absl::StatusOr<ForwardRunnerFactory> CudaRunnerFromFlags(int device);

class GpuKvPaths {
 public:
  // Sets options->kv_device (this GPU's identity) and the device KV hooks
  // for `engine` on CUDA device `device`; the CUDA IPC receiver listens on
  // `kv_host`. Decode and both roles receive, every role sends. The paths
  // must outlive the WorkerService built from *options; call
  // StopReceiving() once the gRPC server is shut down, before the service
  // and the engine are destroyed (its callbacks reach both).
  static absl::StatusOr<std::unique_ptr<GpuKvPaths>> Create(
      Engine* engine, int device, const std::string& kv_host,
      v1::WorkerRole role, WorkerServiceOptions* options);
  ~GpuKvPaths() { StopReceiving(); }
  GpuKvPaths(const GpuKvPaths&) = delete;
  GpuKvPaths& operator=(const GpuKvPaths&) = delete;

  // Stops the NCCL receiver, whose callbacks reach into the engine and the
  // service.
  void StopReceiving();

 private:
  GpuKvPaths() = default;

  std::unique_ptr<CudaIpcApi> ipc_api_;
  std::unique_ptr<CudaIpcPeerMappings> ipc_mappings_;
  std::unique_ptr<NcclApi> nccl_api_;
  std::unique_ptr<NcclCommPool> nccl_pool_;
  std::unique_ptr<NcclKvReceiver> nccl_receiver_;
  std::unique_ptr<NcclPairing> nccl_pairing_;
};

}  // namespace baton

#endif  // BATON_WORKER_SERVICE_GPU_KV_PATHS_H_
