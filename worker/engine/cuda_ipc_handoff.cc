#include "worker/engine/cuda_ipc_handoff.h"

#include <memory>
#include <utility>

#include "common/status_macros.h"

namespace baton {

CudaIpcKvReceiverCallbacks CudaIpcImportCallbacks(Engine* engine) {
  CudaIpcKvReceiverCallbacks callbacks;
  callbacks.secret = [engine](uint64_t transfer_id) {
    return engine->ImportSecret(transfer_id);
  };
  callbacks.lookup =
      [engine](uint64_t transfer_id) -> absl::StatusOr<CudaIpcKvTarget> {
    BATON_ASSIGN_OR_RETURN(KvTransferTarget target,
                           engine->DeviceImportTarget(transfer_id));
    return CudaIpcKvTarget{std::move(target), engine->device_kv_pool()};
  };
  callbacks.on_done = [engine](uint64_t transfer_id, absl::Status status) {
    engine->ImportDone(transfer_id, std::move(status));
  };
  return callbacks;
}

KvSinkFactory CudaIpcKvSinkFactory(CudaIpcPeerMappings* mappings,
                                   std::string endpoint, uint64_t transfer_id,
                                   std::string model_id,
                                   CudaIpcKvSenderOptions options) {
  return
      [mappings, endpoint = std::move(endpoint), transfer_id,
       model_id = std::move(model_id), options](
          const KvSinkInfo& info) -> absl::StatusOr<std::unique_ptr<KvSink>> {
        BATON_ASSIGN_OR_RETURN(
            std::unique_ptr<CudaIpcKvSender> sender,
            CudaIpcKvSender::Connect(mappings, endpoint, transfer_id, options));
        return std::unique_ptr<KvSink>(std::make_unique<TransportKvSink>(
            std::move(sender), transfer_id, model_id, info));
      };
}

}  // namespace baton
