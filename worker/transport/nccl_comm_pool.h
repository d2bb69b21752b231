// A pool of NCCL communicators, one per prefill/decode worker pair, for the
// NCCL KV transport. CUDA-free: every NCCL / CUDA runtime call goes through
// NcclApi, whose real implementation (CreateCudaNcclApi in
// nccl_kv_transport.h) is built only with BATON_CUDA; tests use a fake.
//
// Life of a pair's communicator (comm_key "<prefill_worker_id>/<decode_id>"):
//   - the decode worker makes a unique id (NcclCommPool::NewUniqueId), the
//     coordinator carries it to both sides in baton.v1.NcclHandshake;
//   - each side calls GetOrCreate with the handshake: the first call joins
//     the communicator in non-blocking mode and polls it until it is ready
//     or options.init_timeout passes (then ncclCommAbort, DeadlineExceeded);
//     later calls with the same generation reuse it;
//   - a handshake with a higher generation aborts the pooled communicator
//     and joins the new one; a lower generation is refused;
//   - any wait that passes its deadline, an NCCL async error, or Abort()
//     (peer death reported by the control plane) tears the communicator down
//     with ncclCommAbort; the pair then stays unusable until a handshake
//     with a higher generation arrives. No wait is ever unbounded.
#ifndef BATON_WORKER_TRANSPORT_NCCL_COMM_POOL_H_
#define BATON_WORKER_TRANSPORT_NCCL_COMM_POOL_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace baton {

// Bytes of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES).
inline constexpr size_t kNcclUniqueIdBytes = 128;
using NcclUniqueIdBytes = std::array<uint8_t, kNcclUniqueIdBytes>;

// Bytes of one control message (a KV header or a verdict, see
// nccl_kv_transport.h). Each pair owns one send and one receive buffer of
// this size on its device and two pinned host staging buffers.
inline constexpr uint64_t kNcclControlBytes = 8192;

// Opaque handles: ncclComm_t and cudaStream_t in the real API.
using NcclCommHandle = void*;
using NcclStreamHandle = void*;

// The NCCL and CUDA runtime calls the transport makes. Implementations must
// be thread-safe; the pool never calls two methods on the same communicator
// or stream concurrently.
class NcclApi {
 public:
  virtual ~NcclApi() = default;

  // ncclGetUniqueId.
  virtual absl::StatusOr<NcclUniqueIdBytes> GetUniqueId() = 0;
  // ncclCommInitRankConfig with config.blocking = 0 on `device`: returns at
  // once; poll CommInProgress until it reports false.
  virtual absl::StatusOr<NcclCommHandle> CommInitRankNonBlocking(
      const NcclUniqueIdBytes& id, int nranks, int rank, int device) = 0;
  // ncclCommGetAsyncError: true while ncclInProgress, false on ncclSuccess,
  // an error status (Unavailable/Internal naming the NCCL error) otherwise.
  virtual absl::StatusOr<bool> CommInProgress(NcclCommHandle comm) = 0;
  // ncclCommAbort: never blocks on the peer.
  virtual void CommAbort(NcclCommHandle comm) = 0;
  // ncclCommDestroy of an idle, healthy communicator.
  virtual void CommDestroy(NcclCommHandle comm) = 0;

  virtual absl::StatusOr<NcclStreamHandle> StreamCreate(int device) = 0;
  virtual void StreamDestroy(int device, NcclStreamHandle stream) = 0;
  // cudaStreamQuery: true once all work on the stream has completed.
  virtual absl::StatusOr<bool> StreamDone(NcclStreamHandle stream) = 0;

  // Device memory on `device` / pinned host memory.
  virtual absl::StatusOr<void*> DeviceAlloc(int device, uint64_t bytes) = 0;
  virtual void DeviceFree(int device, void* ptr) = 0;
  virtual absl::StatusOr<void*> HostAlloc(uint64_t bytes) = 0;
  virtual void HostFree(void* ptr) = 0;
  // cudaMemcpyAsync(cudaMemcpyDefault) on `stream`.
  virtual absl::Status CopyAsync(int device, void* dst, const void* src,
                                 uint64_t bytes, NcclStreamHandle stream) = 0;

  // One point-to-point operation on raw bytes (ncclUint8).
  struct P2pOp {
    enum class Kind { kSend, kRecv };
    Kind kind = Kind::kSend;
    void* buffer = nullptr;  // device-accessible; const for sends
    uint64_t bytes = 0;
  };
  // Enqueues `ops` with `peer` on `stream` as one ncclGroupStart/End. On a
  // non-blocking communicator the group may still be in progress on return:
  // poll CommInProgress, then StreamDone.
  virtual absl::Status P2pGroup(int device, NcclCommHandle comm, int peer,
                                NcclStreamHandle stream,
                                std::span<const P2pOp> ops) = 0;
};

// The fields of baton.v1.NcclHandshake (worker.proto).
struct NcclPairHandshake {
  std::string comm_key;  // "<prefill_worker_id>/<decode_worker_id>"
  uint64_t generation = 0;
  NcclUniqueIdBytes unique_id{};
  int nranks = 2;
  int sender_rank = 0;
  int receiver_rank = 1;
  int sender_device = 0;
  int receiver_device = 0;
};

// InvalidArgument naming the field: empty comm_key, nranks != 2, ranks not
// {0, 1}, a negative device.
absl::Status ValidateNcclHandshake(const NcclPairHandshake& handshake);

// The unique id from NcclHandshake.unique_id bytes; InvalidArgument unless
// exactly kNcclUniqueIdBytes long.
absl::StatusOr<NcclUniqueIdBytes> NcclUniqueIdFromBytes(absl::string_view b);

// Which end of the pair this process is.
enum class NcclPairRole { kSender, kReceiver };

struct NcclCommPoolOptions {
  // --- Behaviour ---
  // Joining a communicator fails with DeadlineExceeded (and ncclCommAbort)
  // if it is not ready after this long.
  absl::Duration init_timeout = absl::Seconds(30);
  // Pairs held at once; GetOrCreate of one more is ResourceExhausted.
  int max_pairs = 256;
  // --- Performance ---
  // Sleep between two polls of a communicator or stream.
  absl::Duration poll_interval = absl::Microseconds(20);
};

// One pair's communicator, its stream and control buffers. Handed out as a
// shared_ptr; resources are released when the pool and every user have let
// go. Thread-safe.
class NcclPairComm {
 public:
  NcclPairComm(const NcclPairComm&) = delete;
  NcclPairComm& operator=(const NcclPairComm&) = delete;
  // Destroys the communicator (ncclCommDestroy if healthy, else it was
  // aborted already), then the stream and buffers.
  ~NcclPairComm();

  const std::string& comm_key() const { return comm_key_; }
  uint64_t generation() const { return generation_; }
  int rank() const { return rank_; }
  int peer() const { return peer_; }
  int device() const { return device_; }
  NcclApi& api() const { return *api_; }

  // Users of the pair hold this across one exchange (enqueue ... Wait), so
  // exchanges of concurrent transfers on the pair never interleave.
  absl::Mutex& exchange_mutex() { return exchange_mu_; }

  // Device buffers of kNcclControlBytes each, and their pinned host
  // staging twins (for cudaMemcpy in and out).
  void* device_send_control() const { return device_control_; }
  void* device_recv_control() const {
    return static_cast<uint8_t*>(device_control_) + kNcclControlBytes;
  }
  uint8_t* host_send_control() const { return host_control_; }
  uint8_t* host_recv_control() const {
    return host_control_ + kNcclControlBytes;
  }

  // OK while usable; otherwise the reason it was aborted or failed.
  absl::Status health() const;
  // The reason it was aborted or failed; OK before the join and while
  // usable.
  absl::Status failure() const;

  // Enqueues a copy / a group of p2p ops with the peer on the pair's stream.
  // The pair's health if it is unusable; an enqueue error aborts the pair.
  absl::Status CopyAsync(void* dst, const void* src, uint64_t bytes);
  absl::Status P2pGroup(std::span<const NcclApi::P2pOp> ops);

  // Waits until everything enqueued has completed. On an NCCL/CUDA error
  // (Unavailable), at `deadline` (DeadlineExceeded, naming `what` and the
  // pair) or when `stop` returns true (Cancelled) the communicator is
  // aborted and that status returned.
  absl::Status Wait(absl::Time deadline, absl::string_view what,
                    const std::function<bool()>& stop = nullptr);

  // ncclCommAbort (once); health() then returns `reason`. Safe from any
  // thread, also while another thread is in Wait.
  void Abort(absl::Status reason);

 private:
  friend class NcclCommPool;
  NcclPairComm(NcclApi* api, const NcclCommPoolOptions& options,
               std::string comm_key, uint64_t generation, int rank, int peer,
               int device);
  // Joins the communicator and allocates the stream and buffers, once;
  // concurrent callers wait for the first. On failure the pair is left
  // aborted with the returned status.
  absl::Status EnsureInitialized(const NcclUniqueIdBytes& id, int nranks);
  absl::Status Initialize(const NcclUniqueIdBytes& id, int nranks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(init_mu_);
  // Aborts the comm if not yet done. REQUIRES: state_mu_ held.
  void AbortLocked(absl::Status reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);

  NcclApi* const api_;
  const NcclCommPoolOptions options_;
  const std::string comm_key_;
  const uint64_t generation_;
  const int rank_;
  const int peer_;
  const int device_;

  absl::Mutex init_mu_;
  bool init_done_ ABSL_GUARDED_BY(init_mu_) = false;
  absl::Mutex exchange_mu_;
  // Serializes every API call on comm_ / stream_ with Abort.
  mutable absl::Mutex state_mu_;
  NcclCommHandle comm_ ABSL_GUARDED_BY(state_mu_) = nullptr;
  bool aborted_ ABSL_GUARDED_BY(state_mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(state_mu_) =
      absl::UnavailableError("not initialized");
  NcclStreamHandle stream_ = nullptr;
  void* device_control_ = nullptr;   // 2 * kNcclControlBytes
  uint8_t* host_control_ = nullptr;  // 2 * kNcclControlBytes, pinned
};

class NcclCommPool {
 public:
  // `api` must outlive the pool and every NcclPairComm it hands out.
  // InvalidArgument for a null api or a non-positive limit / timeout.
  static absl::StatusOr<std::unique_ptr<NcclCommPool>> Create(
      NcclApi* api, const NcclCommPoolOptions& options = {});

  NcclCommPool(const NcclCommPool&) = delete;
  NcclCommPool& operator=(const NcclCommPool&) = delete;
  // Aborts every pooled communicator still in use elsewhere; idle ones are
  // destroyed when their last user lets go.
  ~NcclCommPool();

  // A fresh unique id for a new generation of a pair (decode side).
  absl::StatusOr<NcclUniqueIdBytes> NewUniqueId();

  // The pair's communicator for `role`, joined lazily (blocks up to
  // init_timeout on first use of a generation). Errors: InvalidArgument (bad
  // handshake), FailedPrecondition (generation older than the pooled one, or
  // pooled with the other rank), DeadlineExceeded (join timed out),
  // ResourceExhausted (max_pairs); once a generation failed or was aborted,
  // every later call for it returns the status that ended it (its unique id
  // is spent; the coordinator must hand out a higher generation).
  absl::StatusOr<std::shared_ptr<NcclPairComm>> GetOrCreate(
      const NcclPairHandshake& handshake, NcclPairRole role);

  // Peer death or cancellation: aborts the pair's communicator; it stays in
  // the pool (so its generation is remembered) until a newer handshake.
  // No-op for an unknown key.
  void Abort(absl::string_view comm_key, absl::Status reason);
  // Drops the pair from the pool (destroyed once idle). No-op if unknown.
  void Release(absl::string_view comm_key);

  int num_pairs() const;
  // Why the pair's pooled communicator was aborted or failed; OK if it has
  // not (joining, usable) or there is none. A decode worker hands out a
  // new generation for a pair whose communicator failed.
  absl::Status PairFailure(absl::string_view comm_key) const;
  // The pooled generation of `comm_key`, NotFound if none.
  absl::StatusOr<uint64_t> generation(absl::string_view comm_key) const;

 private:
  NcclCommPool(NcclApi* api, const NcclCommPoolOptions& options)
      : api_(api), options_(options) {}

  NcclApi* const api_;
  const NcclCommPoolOptions options_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<NcclPairComm>, std::less<>> pairs_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_WORKER_TRANSPORT_NCCL_COMM_POOL_H_
