// The baton.v1.Worker gRPC service around one Engine (callback API).
//
// Prefill: with a kv_target, Engine::SubmitPrefill hands the KV cache over
//   TCP to the decode worker's receiver; the stream is first_token, then
//   handoff. Without one (a BOTH worker), the whole request runs here: the
//   stream is first_token then an empty handoff, and the remaining output is
//   kept for a later Decode of the same request id on this worker.
// ReserveKv: Engine::ReserveImport under a fresh transfer id; the endpoint
//   is this worker's TcpKvReceiver.
// Decode: Engine::StartImportedDecode once the import has landed (waiting
//   for it if needed), or the colocated request's remaining stream.
// Cancel: Engine::Cancel plus the end of any stream waiting here.
// The engine runs on its own thread (EngineLoop); RPC handlers never compute.
#ifndef BATON_WORKER_SERVICE_WORKER_SERVICE_H_
#define BATON_WORKER_SERVICE_WORKER_SERVICE_H_

#include <grpcpp/security/credentials.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "baton/v1/worker.grpc.pb.h"
#include "common/grpc/stream_reactor.h"
#include "common/metrics/metrics.h"
#include "worker/engine/cost_profile.h"
#include "worker/engine/engine.h"
#include "worker/engine/kv_sink.h"
#include "worker/service/callback_gate.h"
#include "worker/service/engine_loop.h"
#include "worker/service/following_kv_targets.h"
#include "worker/service/reservation_queue.h"
#include "worker/service/worker_metrics.h"
#include "worker/transport/tcp_kv_transport.h"

namespace baton {

struct WorkerServiceOptions {
  v1::WorkerRole role = v1::WORKER_ROLE_BOTH;
  // Quoted in KV headers and checked against ReserveKv / Prefill model ids
  // (when both sides name one).
  std::string model_id;
  // Where the TcpKvReceiver for imports listens (port 0: any free port).
  std::string kv_host = "127.0.0.1";
  int kv_port = 0;
  // A prefill's handoff fails (and frees its blocks) after this long.
  std::chrono::milliseconds handoff_timeout{30000};
  // A ReserveKv whose transfer has not started within its
  // reservation_ttl_ms (this default when the request gives 0) is freed by
  // ExpireReservations.
  absl::Duration reservation_ttl = absl::Minutes(10);
  // ReserveKv calls that may wait here for room at once (queue_ms > 0);
  // more are refused with RESOURCE_EXHAUSTED.
  size_t max_queued_reservations = 256;
  // Prefill calls refused (RESOURCE_EXHAUSTED) while this many requests
  // wait for the engine; 0: no bound. The coordinator's admission bounds
  // its own queue; this bounds the worker's across coordinator replicas.
  int64_t max_waiting_requests = 1024;
  // A TCP KV connection (sending or receiving) that makes no progress for
  // this long fails its transfer.
  absl::Duration kv_stall_timeout = absl::Seconds(10);
  // Set (--kv_tls): the TCP KV connections this worker opens and accepts
  // are mutual TLS (worker/transport/kv_tls.h).
  std::shared_ptr<KvTls> kv_tls = nullptr;
  // Set (--simulate_kv_transfers, simulated engines only): the TCP KV
  // handoffs this worker sends carry no bytes (simulated layer frames) and
  // end no earlier than this profile's transfer time; the ones it receives
  // may be such handoffs too (worker/engine/simulated_runner.h).
  std::optional<WorkerProfile> simulated_kv_transfers;
  // Where the worker's metrics are registered (labelled with the role);
  // null: the process-wide metrics::Registry(). Must outlive the service.
  prometheus::Registry* metrics_registry = nullptr;

  // How this worker calls other workers' control ports (PairKv): mutual
  // TLS when the control plane has certificates; null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> peer_credentials;

  // --- Device-direct KV (GPU workers) ---
  // The device holding the engine's KV pool ("HOST/GPU-UUID"); empty for a
  // CPU worker.
  std::string kv_device;
  // The device-direct transport below speaks (CUDA IPC).
  v1::KvTransport device_kv_transport = v1::KV_TRANSPORT_CUDA_IPC;
  // Decode and both roles: starts a receiver that lands transfers in the
  // engine's device pool (e.g. CudaIpcKvReceiver with
  // CudaIpcImportCallbacks). ReserveKv then offers its endpoint, with
  // kv_device, as an alternative to the TCP one. Null: TCP only.
  std::function<absl::StatusOr<std::unique_ptr<KvReceiver>>(Engine*)>
      start_device_receiver;
  // Prefill side: the sink for a device_kv_transport endpoint whose device
  // is kv_device (the sender shares the receiver's GPU), reading the
  // engine's device pool (e.g. CudaIpcKvSinkFactory). Null: such endpoints
  // are passed over for HOST_TCP.
  std::function<KvSinkFactory(const std::string& address, uint64_t transfer_id,
                              const std::string& model_id,
                              const std::string& transfer_secret)>
      make_device_sink;
  // NCCL, between GPU workers on different devices (or nodes). Decode
  // side: expects transfer `transfer_id` on the pair (request.
  // prefill_worker, `decode_worker_id`) and returns the pair's handshake
  // (PairKv; see NcclPairing). ReserveKv then offers KV_TRANSPORT_NCCL with
  // this worker's address and kv_device. Null: NCCL is not offered.
  std::function<absl::StatusOr<v1::NcclHandshake>(
      const v1::PairKvRequest& request, uint64_t transfer_id,
      const std::string& decode_worker_id)>
      expect_nccl;
  // Prefill side: the sink for an NCCL endpoint on another device, which
  // calls PairKv(`pair`) on the decode worker at `decode_address` when the
  // handoff starts and sends from the engine's device pool. Null: NCCL
  // endpoints are passed over.
  std::function<KvSinkFactory(const std::string& decode_address,
                              const v1::PairKvRequest& pair,
                              const std::string& model_id)>
      make_nccl_sink;
};

class DecodeStream;
struct LocalRequest;

class WorkerService final : public v1::Worker::CallbackService {
 public:
  // Starts the KV receiver (decode and both roles) and the engine thread.
  // `engine` must outlive the service. InvalidArgument for a missing engine
  // or an unspecified role; the receiver's error if it cannot listen.
  static absl::StatusOr<std::unique_ptr<WorkerService>> Create(
      const WorkerServiceOptions& options, Engine* engine);
  // The gRPC server must be shut down first. Stops the receiver and the
  // engine thread, then ends every request still in the engine
  // (Engine::Shutdown) and every Decode waiting for its KV, with
  // Unavailable: no stream is left open.
  ~WorkerService() override;
  WorkerService(const WorkerService&) = delete;
  WorkerService& operator=(const WorkerService&) = delete;

  // host:port of the KV receiver; empty for a prefill-only worker.
  std::string kv_endpoint() const;
  // host:port of the device-direct KV receiver; empty if none.
  std::string device_kv_endpoint() const;
  // Identity reported by GetWorkerStatus (set once registered).
  void SetWorkerRef(const std::string& worker_id, const std::string& address);
  // Load right now, as heartbeats and GetWorkerStatus report it.
  v1::WorkerLoad Load();
  // The prefix cache's changes for one coordinator (Engine::
  // PrefixCacheEventsSince), at most kMaxPrefixCacheEvents hashes, packed
  // for a heartbeat; *last_seq becomes what to pass as `after` next time.
  static constexpr size_t kMaxPrefixCacheEvents = 65536;
  v1::PrefixCacheEvents PrefixCacheEvents(std::optional<uint64_t> after,
                                          uint64_t* last_seq);
  // Requests holding (or about to hold) blocks here. With `owner`: only
  // those the coordinator replica `owner` took, and those taken without a
  // coordinator_id (PrefillRequest / ReserveKvRequest.coordinator_id).
  std::vector<std::string> LeasedRequestIds(
      std::optional<std::string> owner = std::nullopt);
  // Frees every lease of request_id here, as the Cancel RPC does; returns
  // whether the request was known.
  bool CancelRequest(const std::string& request_id, const std::string& reason);
  // Frees every reservation whose transfer has not started by its deadline
  // (and whose KV has not landed); returns the request ids freed. The
  // heartbeat loop calls it every interval.
  std::vector<std::string> ExpireReservations(absl::Time now = absl::Now());
  // The worker's Prometheus metrics; their gauges are refreshed from the
  // engine before every collection of the metrics registry (and by
  // RefreshMetrics).
  WorkerMetrics& metrics() { return *metrics_; }
  void RefreshMetrics();

  grpc::ServerWriteReactor<v1::PrefillResponse>* Prefill(
      grpc::CallbackServerContext* context,
      const v1::PrefillRequest* request) override;
  grpc::ServerUnaryReactor* PairKv(grpc::CallbackServerContext* context,
                                   const v1::PairKvRequest* request,
                                   v1::PairKvResponse* response) override;
  grpc::ServerUnaryReactor* ReserveKv(grpc::CallbackServerContext* context,
                                      const v1::ReserveKvRequest* request,
                                      v1::ReserveKvResponse* response) override;
  grpc::ServerWriteReactor<v1::DecodeResponse>* Decode(
      grpc::CallbackServerContext* context,
      const v1::DecodeRequest* request) override;
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* context,
                                   const v1::CancelRequest* request,
                                   v1::CancelResponse* response) override;
  grpc::ServerUnaryReactor* SetKvTarget(
      grpc::CallbackServerContext* context,
      const v1::SetKvTargetRequest* request,
      v1::SetKvTargetResponse* response) override;
  grpc::ServerUnaryReactor* GetWorkerStatus(
      grpc::CallbackServerContext* context,
      const v1::GetWorkerStatusRequest* request,
      v1::GetWorkerStatusResponse* response) override;
  grpc::ServerUnaryReactor* ResetPrefixCache(
      grpc::CallbackServerContext* context,
      const v1::ResetWorkerPrefixCacheRequest* request,
      v1::ResetWorkerPrefixCacheResponse* response) override;

 private:
  using PrefillReactor = StreamReactor<v1::PrefillResponse>;
  using DecodeReactor = StreamReactor<v1::DecodeResponse>;

  // A ReserveKv whose Decode has not started yet.
  struct PendingImport {
    uint64_t transfer_id = 0;
    // ExpireReservations frees it after this unless its transfer started.
    absl::Time expires = absl::InfiniteFuture();
    bool landed = false;
    absl::Status landed_status;
    // A Decode that arrived before the KV landed, and its request.
    DecodeReactor* waiting = nullptr;
    v1::DecodeRequest waiting_request;
    std::chrono::steady_clock::time_point waiting_since;
  };

  // A KV import seen by the receiver: when its first frame arrived and the
  // bytes it carries.
  struct InboundTransfer {
    std::chrono::steady_clock::time_point start;
    uint64_t bytes = 0;
  };

  WorkerService(const WorkerServiceOptions& options, Engine* engine);

  // The engine's import callbacks, also measuring each transfer
  // (worker_service_metrics.cc).
  KvReceiverCallbacks MeteredImportCallbacks();
  // The TCP KV receiver's options (worker_service_kv.cc).
  static TcpKvReceiverOptions KvReceiverOptions(
      const WorkerServiceOptions& options);
  // The sink of a split prefill's handoff to a TCP endpoint (simulated
  // when options_.simulated_kv_transfers is set).
  KvSinkFactory TcpKvSink(const std::string& address, uint64_t transfer_id,
                          const std::string& secret) const;
  // Records how a Prefill / Decode stream that never reached the engine
  // (or ended outside it) ended.
  void RecordEnd(absl::string_view phase, const absl::Status& status);

  // The sink of a split prefill's handoff from its target's endpoints (a
  // device-direct one on this worker's device first), and the transport
  // (worker_service_sink.cc).
  absl::Status ChooseKvSink(const v1::PrefillRequest& request,
                            PrefillOptions* prefill_options,
                            v1::KvTransport* chosen);
  // The sink of a prefill whose target follows it: opened once SetKvTarget
  // delivered the target (HOST_TCP), leaving out the blocks the decode
  // worker holds.
  KvSinkFactory FollowingKvSink(const std::string& id);
  absl::Status StartSplitPrefill(const v1::PrefillRequest& request,
                                 GenerationRequest generation,
                                 PrefillReactor* reactor);
  absl::Status StartLocalRequest(GenerationRequest generation,
                                 const std::string& owner,
                                 PrefillReactor* reactor);
  void OnLocalOutput(const std::shared_ptr<LocalRequest>& local,
                     const RequestOutput& output);
  // Runs on the receiver's thread when an import ended.
  void OnLanded(const std::string& request_id, absl::Status status);
  // Attaches a Decode to a local request or a pending import (OK: the
  // reactor is now owned by it). AlreadyExists: the import has landed and
  // the caller starts it. Other errors: the caller closes the reactor.
  absl::Status AttachDecodeLocked(const v1::DecodeRequest& request,
                                  DecodeReactor* reactor,
                                  std::chrono::steady_clock::time_point arrival)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The reactor's on_cancel for request `id`: cancels it on this worker,
  // through cancel_gate_ (gRPC may call it while the service is being
  // destroyed; after the destructor's first step it does nothing).
  std::function<void()> CancelOnClientGone(std::string id, const char* reason);
  // ReserveKv once the request passed its checks: reserves KV under a
  // fresh transfer id and fills `response` (ResourceExhausted: no room).
  absl::Status Reserve(const v1::ReserveKvRequest& request,
                       v1::ReserveKvResponse* response);
  // StartImportedDecode for a landed import; closes the reactor on error.
  void StartImportedDecode(const v1::DecodeRequest& request,
                           DecodeReactor* reactor,
                           std::chrono::steady_clock::time_point arrival);

  const WorkerServiceOptions options_;
  Engine* const engine_;
  // Shared with every reactor's on_cancel; closed first at destruction.
  const std::shared_ptr<CallbackGate> cancel_gate_ =
      std::make_shared<CallbackGate>();
  std::unique_ptr<TcpKvReceiver> receiver_;
  std::unique_ptr<KvReceiver> device_receiver_;  // see start_device_receiver
  // Idle connections to decode workers' KV receivers, reused by the next
  // handoff to the same worker.
  const std::shared_ptr<TcpKvConnectionPool> kv_connections_ =
      std::make_shared<TcpKvConnectionPool>();
  std::unique_ptr<EngineLoop> loop_;
  // ReserveKv calls waiting for room (decode and both roles).
  std::unique_ptr<ReservationQueue> reserve_queue_;
  // Split prefills whose KV target follows them (kv_target_follows); a
  // target that comes first waits as long as a handoff would.
  FollowingKvTargets following_{absl::FromChrono(options_.handoff_timeout)};
  const std::unique_ptr<WorkerMetrics> metrics_;
  // Prompt tokens submitted whose prefill has not finished.
  std::atomic<int64_t> queued_prefill_tokens_{0};
  std::unique_ptr<metrics::ScrapeHook> scrape_hook_;

  absl::Mutex inbound_mu_;
  absl::flat_hash_map<uint64_t, InboundTransfer> inbound_
      ABSL_GUARDED_BY(inbound_mu_);

  absl::Mutex mu_;
  v1::WorkerRef ref_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, PendingImport> imports_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<LocalRequest>> locals_
      ABSL_GUARDED_BY(mu_);
  // Split prefills and imported decodes running in the engine.
  absl::flat_hash_set<std::string> running_ ABSL_GUARDED_BY(mu_);
  // The coordinator replica that took each lease, when it said (set in the
  // same critical section as the lease; pruned by LeasedRequestIds).
  absl::flat_hash_map<std::string, std::string> lease_owners_
      ABSL_GUARDED_BY(mu_);
  void TagLeaseLocked(const std::string& id, const std::string& owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!owner.empty()) lease_owners_[id] = owner;
  }
};

}  // namespace baton

#endif  // BATON_WORKER_SERVICE_WORKER_SERVICE_H_
