// A CudaIpcApi for tests without a GPU: "device memory" is host memory the
// test registers as allocations, an IPC handle names an allocation by id and
// opens to the allocation's own address (sender and receiver share one
// process), and a stream is a queue of memcpys run when it is queried.
// Like the CUDA runtime it refuses to open a handle that is already open, and
// it fails a stream whose copy would write outside every allocation. Knobs
// inject stalls and errors.
#ifndef BATON_WORKER_TRANSPORT_CUDA_IPC_FAKE_API_H_
#define BATON_WORKER_TRANSPORT_CUDA_IPC_FAKE_API_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/transport/cuda_ipc_api.h"

namespace baton {

class FakeCudaIpcApi final : public CudaIpcApi {
 public:
  FakeCudaIpcApi() = default;
  FakeCudaIpcApi(const FakeCudaIpcApi&) = delete;
  FakeCudaIpcApi& operator=(const FakeCudaIpcApi&) = delete;

  // Declares [base, base + bytes) a device allocation of `device`. It must
  // stay valid until the fake is destroyed.
  void RegisterAllocation(int device, void* base, uint64_t bytes);

  // While set, enqueued copies do not run and StreamDone reports false;
  // clearing it lets them run at the next StreamDone.
  void SetStallCopies(bool stall);
  // The next CopyBatchAsync / OpenMemory / ExportMemory returns `status`.
  void FailNextCopy(absl::Status status);
  void FailNextOpen(absl::Status status);
  void FailNextExport(absl::Status status);

  int num_exports() const;
  int num_opens() const;
  int num_closes() const;
  // Handles open now.
  int num_open() const;
  // Copies run so far, and their bytes.
  int64_t num_copies() const;
  uint64_t bytes_copied() const;
  int num_streams() const;  // created and not destroyed

  absl::StatusOr<CudaIpcExport> ExportMemory(int device,
                                             const void* ptr) override;
  absl::StatusOr<void*> OpenMemory(int device,
                                   const CudaIpcHandleBytes& handle) override;
  void CloseMemory(int device, void* base) override;
  absl::StatusOr<CudaIpcStreamHandle> StreamCreate(int device) override;
  void StreamDestroy(int device, CudaIpcStreamHandle stream) override;
  absl::Status CopyBatchAsync(int device, std::span<const Copy> copies,
                              CudaIpcStreamHandle stream) override;
  absl::StatusOr<bool> StreamDone(CudaIpcStreamHandle stream) override;

 private:
  struct Allocation {
    int device = 0;
    uint8_t* base = nullptr;
    uint64_t bytes = 0;
    bool open = false;
  };
  struct Stream {
    std::deque<Copy> queue;
    absl::Status error;
  };
  // The allocation holding [p, p + bytes), or null.
  Allocation* Find(const void* p, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<uint64_t, Allocation> allocations_ ABSL_GUARDED_BY(mu_);  // by id
  std::map<Stream*, std::unique_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
  bool stall_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status fail_copy_ ABSL_GUARDED_BY(mu_);
  absl::Status fail_open_ ABSL_GUARDED_BY(mu_);
  absl::Status fail_export_ ABSL_GUARDED_BY(mu_);
  int exports_ ABSL_GUARDED_BY(mu_) = 0;
  int opens_ ABSL_GUARDED_BY(mu_) = 0;
  int closes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t copies_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_copied_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace baton

#endif  // BATON_WORKER_TRANSPORT_CUDA_IPC_FAKE_API_H_
