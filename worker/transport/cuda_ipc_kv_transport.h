// CUDA IPC KV transport: moves one request's KV cache, layer by layer,
// between two processes on the SAME GPU (NCCL refuses two ranks on one
// device). Control travels on a TCP connection as kv_wire.h frames
// (cuda_ipc_wire.h); the bytes are copied by the sender, device to device,
// straight into the receiver's device pool, which the receiver exports once
// (cudaIpcGetMemHandle) and the sender opens once per process
// (CudaIpcPeerMappings, cuda_ipc_api.h).
//
// Protocol for one transfer, sender S (prefill), receiver R (decode):
//   S -> R  hello; R -> S challenge; S -> R proof  (kv_handshake.h: S proves
//                           the reservation's secret; R claims nothing and
//                           grants nothing before, and refuses a transfer
//                           another connection holds)
//   S -> R  layer frame     R looks the transfer up (first frame), checks the
//                           header (ValidateLayerHeader, request id, table
//                           capacity, layer not yet received) BEFORE anything
//                           is written;
//   R -> S  verdict         OK, with a grant on the transfer's first layer
//                           (R's pool handle and the destination block ids),
//                           or the rejection (R reports on_done, the
//                           transfer ends, S writes nothing);
//   S       copies the layer's chunks into R's blocks (one cudaMemcpyBatch
//           of the runs of adjacent chunks) on its stream and waits for it;
//   S -> R  "landed L"      R marks the layer, calls on_layer;
//   ... every layer ...
//   S -> R  finish;  R -> S verdict (OK once every layer landed), or
//   S -> R  abort (no reply).
// S writes a layer only between R's OK for it and its "landed", one layer at
// a time, so R's reservation is never written after a rejection.
//
// Every wait has a deadline: S's waits for a verdict and for its copy
// (stall_timeout), R's waits for the next frame (stall_timeout, idle_timeout
// before a transfer's first frame) and for "landed" (landed_timeout, longer
// than S's copy wait so S gives up first). A stalled or dead peer fails the
// transfer (DeadlineExceeded / Unavailable) and closes the connection. The
// one window no protocol can close: a copy that S enqueued but that never
// completes (a wedged device) cannot be withdrawn; R then waits
// outstanding_grant_grace after failing such a transfer before on_done.
//
// Checksums: as with NCCL, payloads stay in device memory; frames carry
// checksum 0 and R verifies none (the copy never leaves the device).
//
// Requirements: both pools on one device (or peer-accessible devices),
// R's device pool a cudaMalloc allocation (IPC cannot export
// cudaMallocAsync or VMM memory) that lives as long as the receiver. One
// transfer per connection; each sender connects anew (localhost, ~100 us).
#ifndef BATON_WORKER_TRANSPORT_CUDA_IPC_KV_TRANSPORT_H_
#define BATON_WORKER_TRANSPORT_CUDA_IPC_KV_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/transport/cuda_ipc_api.h"
#include "worker/transport/cuda_ipc_wire.h"
#include "worker/transport/kv_handshake.h"
#include "worker/transport/kv_transport.h"
#include "worker/transport/nccl_kv_transport.h"
#include "worker/transport/socket_io.h"

namespace baton {

// --- Sender ----------------------------------------------------------------

struct CudaIpcKvSenderOptions {
  // Connect, each wait for the receiver's verdict and each layer's device
  // copy fail with DeadlineExceeded after this long.
  absl::Duration stall_timeout = absl::Seconds(10);

  // Performance.
  // Sleep between polls of a copy still running (after a short spin).
  absl::Duration poll_interval = absl::Microseconds(20);

  // The reservation's secret (KvTarget.transfer_secret), proved to the
  // receiver when the connection opens (kv_handshake.h).
  std::string transfer_secret = "";
};

// One run of the copies of a layer: where the sender's bytes come from.
// Exposed for tests.
struct CudaIpcSourceRange {
  const uint8_t* data = nullptr;
  uint64_t bytes = 0;
};

// The copies that put `source` (the layer payload, in order, total
// dst_chunks.size() * chunk_bytes bytes) into the destination chunks, split
// at every source and destination boundary and merged where both sides are
// adjacent. REQUIRES: the sizes add up.
std::vector<CudaIpcApi::Copy> PlanCudaIpcCopies(
    std::span<const CudaIpcSourceRange> source,
    std::span<uint8_t* const> dst_chunks, uint64_t chunk_bytes);

class CudaIpcKvSender : public KvSender {
 public:
  // Connects to the receiver at `endpoint` ("host:port") for `transfer_id`
  // and creates a stream on mappings->device(). `mappings` must outlive the
  // sender. Errors: InvalidArgument (null mappings), Unavailable (refused),
  // DeadlineExceeded (connect stalled), the stream's CUDA error.
  static absl::StatusOr<std::unique_ptr<CudaIpcKvSender>> Connect(
      CudaIpcPeerMappings* mappings, absl::string_view endpoint,
      uint64_t transfer_id, const CudaIpcKvSenderOptions& options = {});

  CudaIpcKvSender(const CudaIpcKvSender&) = delete;
  CudaIpcKvSender& operator=(const CudaIpcKvSender&) = delete;
  // Aborts with Cancelled if neither Finish nor Abort was called.
  ~CudaIpcKvSender() override;

  // KvSender contract, except: payload.data() is the address (device, or
  // host: cudaMemcpyDefault) of the layer's payload_bytes contiguous bytes,
  // and header.checksum is not checked.
  absl::Status SendLayer(const KvTransferHeader& header,
                         std::span<const uint8_t> payload) override;
  // The chunks (device or host memory, e.g. KvCache::LayerChunks) are copied
  // in place; `gate` (optional) brackets the copy and the wait for it.
  absl::Status SendLayerChunks(const KvTransferHeader& header,
                               std::span<const std::span<const uint8_t>> chunks,
                               KvReadGate* gate) override;
  // As SendLayer, reading the blocks straight from a paged device pool.
  absl::Status SendLayerFromPool(const KvTransferHeader& header,
                                 const KvDeviceLayerSource& source);
  absl::Status Finish() override;
  void Abort(absl::Status reason) override;

 private:
  CudaIpcKvSender(CudaIpcPeerMappings* mappings, UniqueFd fd,
                  std::string endpoint, uint64_t transfer_id,
                  CudaIpcStreamHandle stream,
                  const CudaIpcKvSenderOptions& options);
  // Caller errors, before anything is sent: InvalidArgument.
  absl::Status CheckHeader(const KvTransferHeader& header) const;
  // Header, verdict (and the grant on the first layer), copies, wait,
  // "landed".
  absl::Status SendLayerFrom(const KvTransferHeader& header,
                             std::span<const CudaIpcSourceRange> source,
                             KvReadGate* gate);
  // After a grant: abort the transfer on the wire, remember `status`.
  absl::Status AbortAfterGrant(absl::Status status);
  // Remembers the first error, closes the socket and, for a peer failure,
  // evicts the peer's mappings.
  absl::Status Fail(absl::Status status);

  CudaIpcPeerMappings* const mappings_;
  UniqueFd fd_;
  const std::string endpoint_;
  const uint64_t transfer_id_;
  const CudaIpcKvSenderOptions options_;
  CudaIpcStreamHandle stream_;
  bool done_ = false;   // Finish or Abort called
  absl::Status error_;  // first error; every later call returns it
  // From the first grant.
  std::shared_ptr<const CudaIpcMapping> mapping_;
  CudaIpcGrant grant_;
  bool copy_in_flight_ = false;  // a copy missed its deadline
};

// --- Receiver --------------------------------------------------------------

// Where one transfer lands.
struct CudaIpcKvTarget {
  // Validation (ValidateLayerHeader), table capacity and block ids. The
  // receiver never touches target.cache's memory.
  KvTransferTarget target;
  // Device address of chunk (0, 0) of the device pool that mirrors
  // target.cache (same layout and num_blocks_total()); inside a cudaMalloc
  // allocation of options.device.
  void* device_pool = nullptr;
};

// As KvReceiverCallbacks; called on the connection threads, possibly
// concurrently for different transfers.
struct CudaIpcKvReceiverCallbacks {
  // Optional: the transfer's secret, which the sender must prove before
  // lookup runs; null accepts any proof (tests of the data path alone).
  KvSecretFn secret;
  // Required.
  std::function<absl::StatusOr<CudaIpcKvTarget>(uint64_t transfer_id)> lookup;
  // Optional.
  std::function<void(uint64_t transfer_id, int64_t layer)> on_layer;
  // Required; exactly once per transfer that lookup returned (a transfer
  // refused before, by its proof, as another connection's or by lookup,
  // is not reported: it may be another connection's).
  std::function<void(uint64_t transfer_id, absl::Status status)> on_done;
};

struct CudaIpcKvReceiverOptions {
  std::string host = "127.0.0.1";
  int port = 0;    // 0: any free port; read it back with port()
  int device = 0;  // the CUDA device of every target's device_pool
  // A started transfer whose sender sends nothing for this long fails with
  // DeadlineExceeded.
  absl::Duration stall_timeout = absl::Seconds(10);
  // After a layer's OK, the wait for its "landed". Keep it longer than the
  // senders' stall_timeout (their copy wait).
  absl::Duration landed_timeout = absl::Seconds(30);
  // A transfer that fails while a layer's copy may still be in flight (no
  // "landed" yet) reports on_done this much later, so a dying sender's
  // last copy has drained before the caller frees the blocks.
  absl::Duration outstanding_grant_grace = absl::Milliseconds(200);
  // A connection waits this long for its transfer's first frame.
  absl::Duration idle_timeout = absl::Seconds(60);
  // Connections served at once; more are closed on accept.
  int max_connections = 256;
};

class CudaIpcKvReceiver : public KvReceiver {
 public:
  // `api` must outlive the receiver. InvalidArgument for a missing callback,
  // a null api or a non-positive timeout; Unavailable/Internal naming the
  // address if it cannot listen.
  static absl::StatusOr<std::unique_ptr<CudaIpcKvReceiver>> Start(
      CudaIpcApi* api, const CudaIpcKvReceiverOptions& options,
      CudaIpcKvReceiverCallbacks callbacks);

  CudaIpcKvReceiver(const CudaIpcKvReceiver&) = delete;
  CudaIpcKvReceiver& operator=(const CudaIpcKvReceiver&) = delete;
  // Ends in-flight transfers (on_done gets Cancelled, after
  // outstanding_grant_grace for a transfer with a layer's copy outstanding),
  // joins every thread, closes every socket.
  ~CudaIpcKvReceiver() override;

  std::string endpoint() const override;
  int port() const { return port_; }
  // Device pools exported so far (each once).
  int num_exported_pools() const;

 private:
  struct Connection {
    std::thread thread;
    std::atomic<bool> done{false};
  };
  struct Transfer;

  CudaIpcKvReceiver(CudaIpcApi* api, const CudaIpcKvReceiverOptions& options,
                    CudaIpcKvReceiverCallbacks callbacks, UniqueFd listen_fd,
                    int port, UniqueFd wake_fd);
  void AcceptLoop();
  void Reap();
  void Serve(int fd);
  // Serves one transfer and returns its final status. *known is set once a
  // frame carried a transfer id (then a verdict is owed), *claimed once
  // lookup returned its target (then on_done is owed); *grant_outstanding
  // is true if it ended between a layer's OK and its "landed".
  absl::Status ServeTransfer(int fd, uint64_t* transfer_id, bool* known,
                             bool* claimed, bool* grant_outstanding);
  // A layer frame: validate, grant, wait for "landed".
  absl::Status ServeLayer(int fd, Transfer& t, const KvFrame& frame,
                          bool* grant_outstanding);
  // The pool's export, made once per device pool.
  absl::StatusOr<CudaIpcExport> ExportPool(const CudaIpcKvTarget& target);

  CudaIpcApi* const api_;
  const CudaIpcKvReceiverOptions options_;
  const CudaIpcKvReceiverCallbacks callbacks_;
  UniqueFd listen_fd_;
  const int port_;
  UniqueFd wake_fd_;  // eventfd; readable once shutdown starts
  std::thread accept_thread_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::list<Connection> connections_ ABSL_GUARDED_BY(mu_);
  std::map<const void*, CudaIpcExport> exports_ ABSL_GUARDED_BY(mu_);
  LiveTransfers live_;  // claimed and not ended (kv_handshake.h)
};

}  // namespace baton

#endif  // BATON_WORKER_TRANSPORT_CUDA_IPC_KV_TRANSPORT_H_
