// The real NcclApi: CUDA runtime and NCCL calls (see nccl_comm_pool.h for
// the interface and nccl_kv_transport.h for the factory).
#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "worker/transport/nccl_kv_transport.h"

namespace baton {
namespace {

// --- The real NcclApi
// ---------------------------------------------------------

absl::Status CudaError(cudaError_t e, absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(e), " (",
                                          cudaGetErrorString(e), ")"));
}

absl::Status NcclError(ncclResult_t r, ncclComm_t comm,
                       absl::string_view what) {
  const char* last = ncclGetLastError(comm);
  return absl::UnavailableError(absl::StrCat(what, ": ", ncclGetErrorString(r),
                                             last != nullptr ? ": " : "",
                                             last != nullptr ? last : ""));
}

ncclComm_t Comm(NcclCommHandle h) { return static_cast<ncclComm_t>(h); }
cudaStream_t Stream(NcclStreamHandle h) { return static_cast<cudaStream_t>(h); }

class CudaNcclApi final : public NcclApi {
 public:
  absl::StatusOr<NcclUniqueIdBytes> GetUniqueId() override {
    ncclUniqueId id;
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      return NcclError(r, nullptr, "ncclGetUniqueId");
    }
    NcclUniqueIdBytes out;
    std::memcpy(out.data(), id.internal, out.size());
    return out;
  }

  absl::StatusOr<NcclCommHandle> CommInitRankNonBlocking(
      const NcclUniqueIdBytes& id, int nranks, int rank, int device) override {
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      return CudaError(e, absl::StrCat("cudaSetDevice(", device, ")"));
    }
    ncclUniqueId uid;
    std::memcpy(uid.internal, id.data(), id.size());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, uid, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      if (comm != nullptr) ncclCommAbort(comm);
      return NcclError(r, nullptr, "ncclCommInitRankConfig");
    }
    return static_cast<NcclCommHandle>(comm);
  }

  absl::StatusOr<bool> CommInProgress(NcclCommHandle comm) override {
    ncclResult_t state = ncclSuccess;
    if (ncclResult_t r = ncclCommGetAsyncError(Comm(comm), &state);
        r != ncclSuccess) {
      return NcclError(r, Comm(comm), "ncclCommGetAsyncError");
    }
    if (state == ncclInProgress) return true;
    if (state != ncclSuccess) {
      return NcclError(state, Comm(comm), "NCCL asynchronous error");
    }
    return false;
  }

  void CommAbort(NcclCommHandle comm) override { ncclCommAbort(Comm(comm)); }
  void CommDestroy(NcclCommHandle comm) override {
    ncclCommDestroy(Comm(comm));
  }

  absl::StatusOr<NcclStreamHandle> StreamCreate(int device) override {
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      return CudaError(e, absl::StrCat("cudaSetDevice(", device, ")"));
    }
    cudaStream_t stream = nullptr;
    if (cudaError_t e =
            cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        e != cudaSuccess) {
      return CudaError(e, "cudaStreamCreateWithFlags");
    }
    return static_cast<NcclStreamHandle>(stream);
  }
  void StreamDestroy(int device, NcclStreamHandle stream) override {
    cudaSetDevice(device);
    cudaStreamDestroy(Stream(stream));
  }
  absl::StatusOr<bool> StreamDone(NcclStreamHandle stream) override {
    const cudaError_t e = cudaStreamQuery(Stream(stream));
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) return false;
    return CudaError(e, "cudaStreamQuery");
  }

  absl::StatusOr<void*> DeviceAlloc(int device, uint64_t bytes) override {
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      return CudaError(e, absl::StrCat("cudaSetDevice(", device, ")"));
    }
    void* p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, bytes); e != cudaSuccess) {
      return absl::ResourceExhaustedError(
          CudaError(e, absl::StrCat("cudaMalloc(", bytes, ")")).message());
    }
    return p;
  }
  void DeviceFree(int device, void* ptr) override {
    cudaSetDevice(device);
    cudaFree(ptr);
  }
  absl::StatusOr<void*> HostAlloc(uint64_t bytes) override {
    void* p = nullptr;
    if (cudaError_t e = cudaMallocHost(&p, bytes); e != cudaSuccess) {
      return absl::ResourceExhaustedError(
          CudaError(e, absl::StrCat("cudaMallocHost(", bytes, ")")).message());
    }
    return p;
  }
  void HostFree(void* ptr) override { cudaFreeHost(ptr); }

  absl::Status CopyAsync(int device, void* dst, const void* src, uint64_t bytes,
                         NcclStreamHandle stream) override {
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      return CudaError(e, absl::StrCat("cudaSetDevice(", device, ")"));
    }
    if (cudaError_t e =
            cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, Stream(stream));
        e != cudaSuccess) {
      return CudaError(e, "cudaMemcpyAsync");
    }
    return absl::OkStatus();
  }

  absl::Status P2pGroup(int device, NcclCommHandle comm, int peer,
                        NcclStreamHandle stream,
                        std::span<const P2pOp> ops) override {
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      return CudaError(e, absl::StrCat("cudaSetDevice(", device, ")"));
    }
    auto ok = [](ncclResult_t r) {
      return r == ncclSuccess || r == ncclInProgress;
    };
    if (ncclResult_t r = ncclGroupStart(); !ok(r)) {
      return NcclError(r, Comm(comm), "ncclGroupStart");
    }
    ncclResult_t first_error = ncclSuccess;
    for (const P2pOp& op : ops) {
      const ncclResult_t r = op.kind == P2pOp::Kind::kSend
                                 ? ncclSend(op.buffer, op.bytes, ncclUint8,
                                            peer, Comm(comm), Stream(stream))
                                 : ncclRecv(op.buffer, op.bytes, ncclUint8,
                                            peer, Comm(comm), Stream(stream));
      if (!ok(r) && first_error == ncclSuccess) first_error = r;
    }
    const ncclResult_t end = ncclGroupEnd();
    if (first_error != ncclSuccess) {
      return NcclError(first_error, Comm(comm), "ncclSend/ncclRecv");
    }
    if (!ok(end)) return NcclError(end, Comm(comm), "ncclGroupEnd");
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<NcclApi> CreateCudaNcclApi() {
  return std::make_unique<CudaNcclApi>();
}

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    return CudaError(e, "cudaGetDeviceCount");
  }
  return count;
}

}  // namespace baton
