// The CudaIpcApi over the CUDA runtime (cuda_ipc_api.h).
#include <cuda.h>  // driver types only: the one driver call is looked up
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/kv_blocks.h"
#include "worker/transport/cuda_ipc_api.h"

namespace baton {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == kCudaIpcHandleBytes);

absl::Status CudaError(cudaError_t e, absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(e), " (",
                                          cudaGetErrorString(e), ")"));
}

absl::Status SetDevice(int device) {
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return CudaError(e, absl::StrCat("cudaSetDevice(", device, ")"));
  }
  return absl::OkStatus();
}

// cuMemGetAddressRange through the runtime's driver entry point, so the
// binary needs no link against libcuda (absent on machines without a
// driver). Null if the driver does not provide it.
using GetAddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
GetAddressRangeFn AddressRangeFn() {
  static GetAddressRangeFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &p, 12000,
                                         cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<GetAddressRangeFn>(nullptr);
    }
    return reinterpret_cast<GetAddressRangeFn>(p);
  }();
  return fn;
}

class CudaRuntimeIpcApi final : public CudaIpcApi {
 public:
  absl::StatusOr<CudaIpcExport> ExportMemory(int device,
                                             const void* ptr) override {
    if (absl::Status s = SetDevice(device); !s.ok()) return s;
    GetAddressRangeFn range = AddressRangeFn();
    if (range == nullptr) {
      return absl::UnimplementedError(
          "cuMemGetAddressRange is not available from the CUDA driver");
    }
    CUdeviceptr base = 0;
    size_t size = 0;
    if (CUresult r = range(&base, &size, reinterpret_cast<CUdeviceptr>(ptr));
        r != CUDA_SUCCESS) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuMemGetAddressRange of the KV device pool failed (",
                       static_cast<int>(r), "): not device memory?"));
    }
    cudaIpcMemHandle_t handle;
    if (cudaError_t e =
            cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base));
        e != cudaSuccess) {
      return CudaError(e, "cudaIpcGetMemHandle of the KV device pool");
    }
    CudaIpcExport out;
    std::memcpy(out.handle.data(), &handle, kCudaIpcHandleBytes);
    out.offset = reinterpret_cast<CUdeviceptr>(ptr) - base;
    out.allocation_bytes = size;
    return out;
  }

  absl::StatusOr<void*> OpenMemory(int device,
                                   const CudaIpcHandleBytes& bytes) override {
    if (absl::Status s = SetDevice(device); !s.ok()) return s;
    cudaIpcMemHandle_t handle;
    std::memcpy(&handle, bytes.data(), kCudaIpcHandleBytes);
    void* p = nullptr;
    if (cudaError_t e =
            cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess);
        e != cudaSuccess) {
      return CudaError(e, "cudaIpcOpenMemHandle of the peer's KV pool");
    }
    return p;
  }

  void CloseMemory(int device, void* base) override {
    if (SetDevice(device).ok()) cudaIpcCloseMemHandle(base);
  }

  absl::StatusOr<CudaIpcStreamHandle> StreamCreate(int device) override {
    if (absl::Status s = SetDevice(device); !s.ok()) return s;
    cudaStream_t stream = nullptr;
    if (cudaError_t e =
            cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        e != cudaSuccess) {
      return CudaError(e, "cudaStreamCreateWithFlags");
    }
    return static_cast<CudaIpcStreamHandle>(stream);
  }

  void StreamDestroy(int device, CudaIpcStreamHandle stream) override {
    if (SetDevice(device).ok()) {
      cudaStreamDestroy(static_cast<cudaStream_t>(stream));
    }
  }

  absl::Status CopyBatchAsync(int device, std::span<const Copy> copies,
                              CudaIpcStreamHandle h) override {
    if (absl::Status s = SetDevice(device); !s.ok()) return s;
    cudaStream_t stream = static_cast<cudaStream_t>(h);
    if (copies.size() > 1 && OnDevice(copies.front()) &&
        OnDevice(copies.back())) {
      // Device to device (the GPU workers' pools): one kernel moves every
      // run at memory speed, where one DMA copy per 64 KiB block is
      // launch-bound (docs/gpu.md).
      static_assert(sizeof(cuda::CopyRun) == sizeof(Copy));
      std::vector<cuda::CopyRun> runs(copies.size());
      for (size_t i = 0; i < copies.size(); ++i) {
        runs[i] = {copies[i].dst, copies[i].src, copies[i].bytes};
      }
      if (cudaError_t e = cuda::CopyRuns(
              runs.data(), static_cast<int64_t>(runs.size()), stream);
          e != cudaSuccess) {
        return CudaError(
            e, absl::StrCat("copying ", runs.size(), " KV runs in a kernel"));
      }
      return absl::OkStatus();
    }
    if (copies.size() > 1) {
      // One call for every run: a fragmented block table costs one driver
      // call per layer, not one per chunk.
      std::vector<void*> dsts(copies.size());
      std::vector<const void*> srcs(copies.size());
      std::vector<size_t> sizes(copies.size());
      for (size_t i = 0; i < copies.size(); ++i) {
        dsts[i] = copies[i].dst;
        srcs[i] = copies[i].src;
        sizes[i] = copies[i].bytes;
      }
      cudaMemcpyAttributes attrs;
      std::memset(&attrs, 0, sizeof(attrs));
      attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t attrs_idx = 0;
      if (cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(),
                               copies.size(), &attrs, &attrs_idx, 1,
                               stream) == cudaSuccess) {
        return absl::OkStatus();
      }
      // Not supported here (driver, memory kinds): one copy per run. A
      // partly enqueued batch is harmless, the same bytes land again.
      cudaGetLastError();
    }
    for (const Copy& c : copies) {
      if (cudaError_t e =
              cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDefault, stream);
          e != cudaSuccess) {
        return CudaError(
            e, absl::StrCat("cudaMemcpyAsync of ", c.bytes, " KV bytes"));
      }
    }
    return absl::OkStatus();
  }

  // Both ends of `c` are device memory (this process's, or mapped from
  // another's): a kernel can copy it.
  static bool OnDevice(const Copy& c) {
    for (const void* p : {static_cast<const void*>(c.dst), c.src}) {
      cudaPointerAttributes a;
      if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return false;
      }
      if (a.type != cudaMemoryTypeDevice) return false;
    }
    return true;
  }

  absl::StatusOr<bool> StreamDone(CudaIpcStreamHandle stream) override {
    const cudaError_t e = cudaStreamQuery(static_cast<cudaStream_t>(stream));
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) return false;
    return CudaError(e, "cudaStreamQuery after a KV copy");
  }
};

}  // namespace

std::unique_ptr<CudaIpcApi> CreateCudaIpcApi() {
  return std::make_unique<CudaRuntimeIpcApi>();
}

}  // namespace baton
