// The engine's ends of a CUDA IPC KV handoff (worker/transport/
// cuda_ipc_kv_transport.h): a sink that reads the prefill engine's device
// pool, and receiver callbacks that land imports in the decode engine's
// device pool. CUDA-free: every CUDA call goes through the transport's
// CudaIpcApi, so tests run them over FakeCudaIpcApi.
#ifndef BATON_WORKER_ENGINE_CUDA_IPC_HANDOFF_H_
#define BATON_WORKER_ENGINE_CUDA_IPC_HANDOFF_H_

#include <cstdint>
#include <string>

#include "worker/engine/engine.h"
#include "worker/engine/kv_sink.h"
#include "worker/transport/cuda_ipc_kv_transport.h"

namespace baton {

// Lookups mark each transfer as landing on the device
// (Engine::ImportTarget(id, true)) and point it at
// engine->device_kv_pool(); on_done is Engine::ImportDone. The engine must
// outlive the receiver.
CudaIpcKvReceiverCallbacks CudaIpcImportCallbacks(Engine* engine);

// Connects a CudaIpcKvSender to `endpoint` for `transfer_id` when the
// handoff starts, reading the chunks from the sending engine's device pool;
// submit with PrefillOptions::sink_reads_device_pool. `mappings` must outlive
// the handoff.
KvSinkFactory CudaIpcKvSinkFactory(CudaIpcPeerMappings* mappings,
                                   std::string endpoint, uint64_t transfer_id,
                                   std::string model_id = "",
                                   CudaIpcKvSenderOptions options = {});

}  // namespace baton

#endif  // BATON_WORKER_ENGINE_CUDA_IPC_HANDOFF_H_
