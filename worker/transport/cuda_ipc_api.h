// The CUDA runtime calls of the CUDA IPC KV transport (cuda_ipc_kv_transport.h)
// behind an interface, so the transport's whole protocol is tested without a
// GPU: CreateCudaIpcApi() (cuda_ipc_api_cuda.cc) calls the CUDA runtime;
// FakeCudaIpcApi (cuda_ipc_fake_api.h) treats host memory as device memory
// within one process.
//
// CudaIpcPeerMappings is the sender process's cache of opened peer pools: the
// CUDA runtime lets a process open a given IPC handle only once per device,
// so every sender of a process shares one mapping per exported pool.
#ifndef BATON_WORKER_TRANSPORT_CUDA_IPC_API_H_
#define BATON_WORKER_TRANSPORT_CUDA_IPC_API_H_

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace baton {

// Bytes of a cudaIpcMemHandle_t (CUDA_IPC_HANDLE_SIZE).
inline constexpr size_t kCudaIpcHandleBytes = 64;
using CudaIpcHandleBytes = std::array<uint8_t, kCudaIpcHandleBytes>;

// Opaque cudaStream_t.
using CudaIpcStreamHandle = void*;

// An exported device allocation: its IPC handle, where the exported pointer
// lies inside the allocation, and the allocation's size.
struct CudaIpcExport {
  CudaIpcHandleBytes handle{};
  uint64_t offset = 0;            // exported pointer - allocation base
  uint64_t allocation_bytes = 0;  // bytes from the allocation base
};

// Implementations are thread-safe. `device` is a CUDA device ordinal of this
// process; every call makes it current on the calling thread first.
class CudaIpcApi {
 public:
  virtual ~CudaIpcApi() = default;

  // cudaIpcGetMemHandle of the cudaMalloc allocation holding `ptr` (not
  // cudaMallocAsync / VMM memory, which IPC handles cannot export).
  virtual absl::StatusOr<CudaIpcExport> ExportMemory(int device,
                                                     const void* ptr) = 0;
  // cudaIpcOpenMemHandle(cudaIpcMemLazyEnablePeerAccess): the base of the
  // peer's allocation in this process. A handle may be open at most once per
  // device at a time (CudaIpcPeerMappings guarantees it).
  virtual absl::StatusOr<void*> OpenMemory(
      int device, const CudaIpcHandleBytes& handle) = 0;
  // cudaIpcCloseMemHandle of a base OpenMemory returned.
  virtual void CloseMemory(int device, void* base) = 0;

  virtual absl::StatusOr<CudaIpcStreamHandle> StreamCreate(int device) = 0;
  virtual void StreamDestroy(int device, CudaIpcStreamHandle stream) = 0;

  // One copy: `bytes` from src to dst, either of them device memory of this
  // process, a mapped peer allocation, or host memory (cudaMemcpyDefault).
  struct Copy {
    void* dst = nullptr;
    const void* src = nullptr;
    uint64_t bytes = 0;
  };
  // Enqueues `copies` on `stream`: device to device, one kernel over every
  // run (kernels/cuda/kv_blocks.h CopyRuns); otherwise one
  // cudaMemcpyBatchAsync, or one cudaMemcpyAsync each. They may run in any
  // order among themselves, so their destinations must not overlap. One
  // call's sources are one kind of memory (device or host), and so are its
  // destinations. Sources must stay unchanged until StreamDone reports true.
  virtual absl::Status CopyBatchAsync(int device, std::span<const Copy> copies,
                                      CudaIpcStreamHandle stream) = 0;
  // cudaStreamQuery: true once every enqueued copy completed; an error
  // status (Internal naming the CUDA error) if one failed.
  virtual absl::StatusOr<bool> StreamDone(CudaIpcStreamHandle stream) = 0;
};

// The CudaIpcApi over the CUDA runtime.
std::unique_ptr<CudaIpcApi> CreateCudaIpcApi();

// Polls StreamDone until true (OK), an error (returned), or `deadline`
// (DeadlineExceeded naming `what`). Spins briefly, then sleeps
// `poll_interval` between polls. A copy that misses the deadline cannot be
// withdrawn: it may still complete later.
absl::Status WaitCudaIpcStream(CudaIpcApi& api, CudaIpcStreamHandle stream,
                               absl::Time deadline,
                               absl::Duration poll_interval,
                               absl::string_view what);

// A peer allocation opened in this process; closed when the last user lets
// go of it (after CudaIpcPeerMappings evicted it or was destroyed).
class CudaIpcMapping {
 public:
  CudaIpcMapping(const CudaIpcMapping&) = delete;
  CudaIpcMapping& operator=(const CudaIpcMapping&) = delete;
  ~CudaIpcMapping();

  // Base of the peer's allocation in this process.
  uint8_t* base() const { return static_cast<uint8_t*>(base_); }

 private:
  friend class CudaIpcPeerMappings;
  struct State;
  CudaIpcMapping(std::shared_ptr<State> state, const CudaIpcHandleBytes& handle,
                 void* base)
      : state_(std::move(state)), handle_(handle), base_(base) {}

  const std::shared_ptr<State> state_;
  const CudaIpcHandleBytes handle_;
  void* const base_;
};

// The sender process's peer pools opened on `device`, one mapping per IPC
// handle, shared by every sender. Thread-safe.
class CudaIpcPeerMappings {
 public:
  // `api` must outlive the cache and every mapping it hands out.
  // InvalidArgument for a null api or a negative device.
  static absl::StatusOr<std::unique_ptr<CudaIpcPeerMappings>> Create(
      CudaIpcApi* api, int device);

  CudaIpcPeerMappings(const CudaIpcPeerMappings&) = delete;
  CudaIpcPeerMappings& operator=(const CudaIpcPeerMappings&) = delete;
  // Drops every cached mapping (each closes once its users let go).
  ~CudaIpcPeerMappings();

  CudaIpcApi& api() const;
  int device() const;

  // The mapping of `handle`, exported by `peer` (the receiver's endpoint):
  // the cached one, or the one still held by a user after an Evict, or a
  // newly opened one (OpenMemory's error if that fails). Waits while an
  // earlier mapping of the handle is being closed.
  absl::StatusOr<std::shared_ptr<const CudaIpcMapping>> Open(
      const CudaIpcHandleBytes& handle, absl::string_view peer);
  // Forgets `handle` / every handle of `peer` (the peer failed or went
  // away); each is closed once the last sender using it lets go. No-op for
  // an unknown handle or peer.
  void Evict(const CudaIpcHandleBytes& handle);
  void EvictPeer(absl::string_view peer);
  // Mappings the cache holds (not counting evicted ones still in use).
  int num_cached() const;

 private:
  explicit CudaIpcPeerMappings(std::shared_ptr<CudaIpcMapping::State> state)
      : state_(std::move(state)) {}

  // Shared with every mapping, which closes itself under state_->mu.
  const std::shared_ptr<CudaIpcMapping::State> state_;
};

}  // namespace baton

#endif  // BATON_WORKER_TRANSPORT_CUDA_IPC_API_H_
