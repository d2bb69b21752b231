// NCCL KV transport: moves one request's KV cache, layer by layer, from a
// prefill worker's device pool into a decode worker's device pool over the
// pair's pooled communicator (nccl_comm_pool.h). Built with BATON_CUDA only.
//
// Protocol on one pair (sender S, receiver R). Every control message is one
// ncclSend/ncclRecv of exactly kNcclControlBytes: a kv_wire.h frame header,
// then request id and model id (layer frames) or the status message (status
// and abort frames), zero padded. A payload is BlocksNeeded(num_tokens)
// transfers of layout.chunk_bytes(), one per block, grouped.
//
//   S -> R  layer frame    R looks the transfer up (first frame), checks the
//                          header (ValidateLayerHeader, table capacity, layer
//                          not yet received) BEFORE posting any receive into
//                          its pool;
//   R -> S  status frame   OK, or the rejection (R then reports on_done and
//                          ends the transfer; S returns the error);
//   S -> R  the layer's blocks, straight into R's pool blocks;
//   ... every layer ...
//   S -> R  finish frame;  R -> S status frame (OK once every layer landed)
//   or S -> R abort frame (no reply).
//
// Exchanges of different transfers on one pair are serialized at layer
// granularity (NcclPairComm::exchange_mutex), so transfers may interleave.
// Every wait has a deadline; on expiry, an NCCL error, or peer death
// (NcclCommPool::Abort) the communicator is torn down with ncclCommAbort and
// every transfer on it fails: nothing can hang.
//
// Checksums: payloads stay in device memory, so frames carry checksum 0 and
// R does not verify one (kv.proto CHECKSUM_TYPE_NONE: integrity is left to
// NCCL's links). All buffers are device memory supplied by the caller: the
// CUDA engine provides its device KV pool; the host KvCache serves only as
// the bookkeeping (layout, block ids) of a device pool of the same shape.
#ifndef BATON_WORKER_TRANSPORT_NCCL_KV_TRANSPORT_H_
#define BATON_WORKER_TRANSPORT_NCCL_KV_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/transport/kv_transport.h"
#include "worker/transport/kv_wire.h"
#include "worker/transport/nccl_comm_pool.h"
#include "worker/transport/nccl_kv_wire.h"

namespace baton {

// The NcclApi over libnccl and the CUDA runtime.
std::unique_ptr<NcclApi> CreateCudaNcclApi();

// cudaGetDeviceCount; an error status (naming the CUDA error) where there
// is no driver or no device.
absl::StatusOr<int> CudaDeviceCount();

// --- Sender ----------------------------------------------------------------

struct NcclKvSenderOptions {
  // Every exchange (header, verdict, payload) fails with DeadlineExceeded,
  // aborting the pair's communicator, after this long.
  absl::Duration stall_timeout = absl::Seconds(10);
};

// One layer of a sequence in a paged device pool laid out as kv_layout.h:
// chunk (layer, block) is at device_pool + (layer * num_blocks_total +
// block) * chunk_bytes.
struct KvDeviceLayerSource {
  const void* device_pool = nullptr;  // device address of chunk (0, 0)
  int64_t num_blocks_total = 0;
  // The sequence's blocks in token order; the first BlocksNeeded(
  // header.num_tokens) are sent.
  std::span<const int32_t> block_ids;
};

class NcclKvSender : public KvSender {
 public:
  // Joins (or reuses) the pair's communicator as handshake.sender_rank.
  // `pool` must outlive the sender. Errors as NcclCommPool::GetOrCreate.
  static absl::StatusOr<std::unique_ptr<NcclKvSender>> Create(
      NcclCommPool* pool, const NcclPairHandshake& handshake,
      uint64_t transfer_id, const NcclKvSenderOptions& options = {});

  NcclKvSender(const NcclKvSender&) = delete;
  NcclKvSender& operator=(const NcclKvSender&) = delete;
  // Aborts with Cancelled if neither Finish nor Abort was called.
  ~NcclKvSender() override;

  // KvSender contract, except: payload.data() is a DEVICE address of
  // payload_bytes contiguous bytes (a multiple of layout.chunk_bytes()), and
  // header.checksum is not checked.
  absl::Status SendLayer(const KvTransferHeader& header,
                         std::span<const uint8_t> payload) override;
  // As SendLayerFromPool: each chunk a DEVICE address of chunk_bytes()
  // bytes (a device pool's chunks, KvPoolAddress::Device), sent in place.
  // `gate` (optional) is held only around the payload's send and wait, never
  // across a wait for the peer's verdict; if it was revoked the payload still
  // goes (the receiver posted for it) and the call returns Cancelled, after
  // which Abort tells the receiver.
  absl::Status SendLayerChunks(const KvTransferHeader& header,
                               std::span<const std::span<const uint8_t>> chunks,
                               KvReadGate* gate) override;
  // As SendLayer, reading the blocks straight from a paged device pool.
  absl::Status SendLayerFromPool(const KvTransferHeader& header,
                                 const KvDeviceLayerSource& source);
  absl::Status Finish() override;
  void Abort(absl::Status reason) override;

 private:
  NcclKvSender(std::shared_ptr<NcclPairComm> comm, uint64_t transfer_id,
               const NcclKvSenderOptions& options)
      : comm_(std::move(comm)), transfer_id_(transfer_id), options_(options) {}
  absl::Status CheckHeader(const KvTransferHeader& header) const;
  // Header, verdict, then the payload ops.
  absl::Status SendLayerOps(const KvTransferHeader& header,
                            std::span<const NcclApi::P2pOp> ops,
                            KvReadGate* gate = nullptr);
  absl::Status Fail(absl::Status status);

  std::shared_ptr<NcclPairComm> comm_;
  uint64_t transfer_id_;
  NcclKvSenderOptions options_;
  bool done_ = false;
  absl::Status error_;
};

// --- Receiver --------------------------------------------------------------

// Where one transfer lands.
struct NcclKvTarget {
  // Validation (ValidateLayerHeader), table capacity and block ids. The
  // receiver never touches target.cache's memory.
  KvTransferTarget target;
  // Device address of chunk (0, 0) of the device pool that mirrors
  // target.cache (same layout and num_blocks_total()).
  void* device_pool = nullptr;
};

// As KvReceiverCallbacks; called on the pair's serving thread.
struct NcclKvReceiverCallbacks {
  // Required.
  std::function<absl::StatusOr<NcclKvTarget>(uint64_t transfer_id)> lookup;
  // Optional.
  std::function<void(uint64_t transfer_id, int64_t layer)> on_layer;
  // Required; exactly once per Expect()ed transfer id.
  std::function<void(uint64_t transfer_id, absl::Status status)> on_done;
};

struct NcclKvReceiverOptions {
  // An Expect()ed transfer whose first frame has not arrived after this
  // long fails with DeadlineExceeded. The control receive it waits on can
  // only be withdrawn by ncclCommAbort, so this aborts the pair's
  // communicator and fails the pair's other transfers too.
  absl::Duration first_frame_timeout = absl::Seconds(60);
  // A started transfer whose sender makes no progress for this long fails
  // (DeadlineExceeded, communicator aborted).
  absl::Duration stall_timeout = absl::Seconds(10);
  // Ended transfer ids remembered per pair, to refuse late frames.
  int max_ended_remembered = 4096;
};

class NcclKvReceiver : public KvReceiver {
 public:
  // `pool` must outlive the receiver. InvalidArgument if a required
  // callback is missing.
  static absl::StatusOr<std::unique_ptr<NcclKvReceiver>> Create(
      NcclCommPool* pool, const NcclKvReceiverOptions& options,
      NcclKvReceiverCallbacks callbacks);

  NcclKvReceiver(const NcclKvReceiver&) = delete;
  NcclKvReceiver& operator=(const NcclKvReceiver&) = delete;
  // Stops every pair thread (aborting a communicator with a pending
  // receive) and reports Cancelled for every transfer not yet done. May
  // block up to the pool's init_timeout while a pair is still joining.
  ~NcclKvReceiver() override;

  // NCCL senders need no address: empty (KvEndpoint.address).
  std::string endpoint() const override { return ""; }

  // Announces that `transfer_id` will arrive over the pair of `handshake`
  // (after the decode worker reserved its blocks). Starts serving the pair
  // if needed; the pair's thread joins the communicator lazily. From here
  // on_done is owed for transfer_id. InvalidArgument for a bad handshake or
  // a transfer id already expected.
  absl::Status Expect(const NcclPairHandshake& handshake, uint64_t transfer_id);

 private:
  struct Transfer {
    NcclKvTarget target;
    KvLayerProgress progress;
  };
  // handshake and awaiting are guarded by mu_; the rest belongs to the
  // pair's thread (read under mu_ by that thread only).
  struct Pair {
    NcclPairHandshake handshake;  // the newest seen
    std::thread thread;
    // Expected transfers not started: id -> (generation, first-frame
    // deadline).
    std::map<uint64_t, std::pair<uint64_t, absl::Time>> awaiting;
    std::map<uint64_t, Transfer> active;
    absl::Time last_progress;
    std::set<uint64_t> ended;
    std::vector<uint64_t> ended_order;
  };

  NcclKvReceiver(NcclCommPool* pool, const NcclKvReceiverOptions& options,
                 NcclKvReceiverCallbacks callbacks)
      : pool_(pool), options_(options), callbacks_(std::move(callbacks)) {}
  void ServePair(Pair* pair);
  // One control frame and what follows it. Non-OK: the communicator failed
  // (already aborted) or the peer broke the protocol.
  absl::Status ServeFrame(Pair* pair, NcclPairComm& comm, absl::Time deadline);
  absl::Status ServeLayer(Pair* pair, NcclPairComm& comm, const KvFrame& f);
  // The active transfer, starting it (lookup) on its first frame; nullptr
  // with *status set when it cannot be served.
  Transfer* StartOrFind(Pair* pair, uint64_t transfer_id, absl::Status* status);
  // Ends a transfer: on_done(status) once, remembered as ended.
  void EndTransfer(Pair* pair, uint64_t transfer_id, absl::Status status);
  // Fails every active transfer, and awaiting ones of generation <=
  // `generation`.
  void FailPair(Pair* pair, const absl::Status& status, uint64_t generation);

  NcclCommPool* const pool_;
  const NcclKvReceiverOptions options_;
  const NcclKvReceiverCallbacks callbacks_;
  std::atomic<bool> stopping_{false};
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Pair>> pairs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_WORKER_TRANSPORT_NCCL_KV_TRANSPORT_H_
