// GPU workers' NCCL KV handoff (worker/transport/nccl_kv_transport.h), bound
// to WorkerService's hooks. The pair handshake travels worker to worker:
// the decode worker offers KV_TRANSPORT_NCCL in ReserveKv; the prefill
// worker, on another device, calls PairKv on it when the handoff starts and
// joins the pair's communicator with the handshake it gets back; the decode
// worker hands out one handshake per pair and a new generation once the
// pair's communicator failed (timeouts abort it: nccl_comm_pool.h).
// Built with BATON_CUDA (the NCCL library); every NCCL and CUDA call goes
// through NcclApi, so tests run it over a loopback fake.
#ifndef BATON_WORKER_SERVICE_NCCL_PAIRING_H_
#define BATON_WORKER_SERVICE_NCCL_PAIRING_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "baton/v1/worker.pb.h"
#include "worker/engine/engine.h"
#include "worker/engine/kv_sink.h"
#include "worker/transport/nccl_comm_pool.h"
#include "worker/transport/nccl_kv_transport.h"

namespace baton {

v1::NcclHandshake ToProto(const NcclPairHandshake& handshake);
// InvalidArgument naming the field (ValidateNcclHandshake, unique id size).
absl::StatusOr<NcclPairHandshake> FromProto(const v1::NcclHandshake& proto);

// Decode side: WorkerServiceOptions::expect_nccl. Thread-safe.
class NcclPairing {
 public:
  // `pool` and `receiver` (whose lookups land in this worker's engine, see
  // NcclImportCallbacks) must outlive it; `device` is the receiver's CUDA
  // ordinal.
  NcclPairing(NcclCommPool* pool, NcclKvReceiver* receiver, int device)
      : pool_(pool), receiver_(receiver), device_(device) {}

  // The pair (request.prefill_worker, decode_worker_id)'s handshake, after
  // receiver->Expect(it, transfer_id). A pair met for the first time, or
  // whose communicator failed, gets a new unique id and a higher
  // generation.
  absl::StatusOr<v1::NcclHandshake> Expect(const v1::PairKvRequest& request,
                                           uint64_t transfer_id,
                                           const std::string& decode_worker_id);

 private:
  NcclCommPool* const pool_;
  NcclKvReceiver* const receiver_;
  const int device_;
  absl::Mutex mu_;
  std::map<std::string, NcclPairHandshake> pairs_ ABSL_GUARDED_BY(mu_);
};

// Lookups land each transfer in engine->device_kv_pool()
// (Engine::ImportTarget(id, true)); on_done is Engine::ImportDone.
NcclKvReceiverCallbacks NcclImportCallbacks(Engine* engine);

// Prefill side: WorkerServiceOptions::make_nccl_sink. When the handoff
// starts: PairKv(`pair` with sender_device) on the decode worker at
// `decode_address` (deadline `rpc_timeout`), then an NcclKvSender on the
// pair's communicator reading the engine's device pool. `pool` must
// outlive the handoff.
// `credentials` (null: plaintext) reach the decode worker's control port.
KvSinkFactory NcclKvSinkFactory(
    NcclCommPool* pool, int sender_device, std::string decode_address,
    v1::PairKvRequest pair, std::string model_id,
    std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr,
    absl::Duration rpc_timeout = absl::Seconds(10));

}  // namespace baton

#endif  // BATON_WORKER_SERVICE_NCCL_PAIRING_H_
