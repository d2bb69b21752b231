#include "worker/cuda/decode_graph_cache.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace baton {
namespace {

absl::Status CaptureError(const DecodeGraphKey& key, absl::string_view what,
                          absl::StatusCode code = absl::StatusCode::kInternal) {
  return absl::Status(
      code, absl::StrCat("capturing the decode graph (bucket ", key.bucket,
                         ", context ", key.context_bound, "): ", what));
}

std::string CudaErrorText(absl::string_view call, cudaError_t err) {
  return absl::StrCat(call, ": ", cudaGetErrorName(err), " (",
                      cudaGetErrorString(err), ")");
}

}  // namespace

DecodeGraphCache::~DecodeGraphCache() {
  for (auto& [key, exec] : execs_) cudaGraphExecDestroy(exec);
}

cudaGraphExec_t DecodeGraphCache::Find(const DecodeGraphKey& key) const {
  const auto it = execs_.find(key);
  return it == execs_.end() ? nullptr : it->second;
}

absl::StatusOr<cudaGraphExec_t> DecodeGraphCache::Capture(
    const DecodeGraphKey& key, cudaStream_t stream,
    const std::function<absl::Status()>& enqueue) {
  absl::Status failure;
  cudaGraphExec_t exec = nullptr;
  cudaError_t err =
      cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) {
    failure = CaptureError(key, CudaErrorText("cudaStreamBeginCapture", err));
  } else {
    // The capture must end whatever `enqueue` returned, or the stream stays
    // in capture mode.
    const absl::Status body = enqueue();
    cudaGraph_t graph = nullptr;
    err = cudaStreamEndCapture(stream, &graph);
    if (!body.ok()) {
      failure = CaptureError(key, body.message(), body.code());
    } else if (err != cudaSuccess || graph == nullptr) {
      failure = CaptureError(key, CudaErrorText("cudaStreamEndCapture", err));
    } else {
      err = cudaGraphInstantiate(&exec, graph, 0);
      if (err != cudaSuccess) {
        exec = nullptr;
        failure = CaptureError(key, CudaErrorText("cudaGraphInstantiate", err));
      }
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
  if (!failure.ok()) {
    // Capture errors are not sticky; later launch checks must not see them.
    cudaGetLastError();
    failures_[key] = failure;
    return failure;
  }
  execs_[key] = exec;
  return exec;
}

std::vector<DecodeGraphKey> DecodeGraphCache::captured() const {
  std::vector<DecodeGraphKey> keys;
  for (const auto& [key, exec] : execs_) keys.push_back(key);
  return keys;
}

std::vector<std::pair<DecodeGraphKey, absl::Status>>
DecodeGraphCache::failures() const {
  return {failures_.begin(), failures_.end()};
}

absl::StatusOr<PinnedInt32Buffer> PinnedInt32Buffer::Create(int64_t elements) {
  PinnedInt32Buffer buffer;
  if (elements <= 0) return buffer;
  const size_t bytes = static_cast<size_t>(elements) * sizeof(int32_t);
  void* ptr = nullptr;
  const cudaError_t err = cudaMallocHost(&ptr, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    const std::string message = absl::StrCat(
        "cudaMallocHost of ", bytes,
        " bytes for the decode graph metadata staging: ", cudaGetErrorName(err),
        " (", cudaGetErrorString(err), ")");
    return err == cudaErrorMemoryAllocation
               ? absl::ResourceExhaustedError(message)
               : absl::InternalError(message);
  }
  buffer.data_ = static_cast<int32_t*>(ptr);
  buffer.size_ = static_cast<size_t>(elements);
  return buffer;
}

PinnedInt32Buffer::PinnedInt32Buffer(PinnedInt32Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

PinnedInt32Buffer& PinnedInt32Buffer::operator=(
    PinnedInt32Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

PinnedInt32Buffer::~PinnedInt32Buffer() { Reset(); }

void PinnedInt32Buffer::Reset() {
  if (data_ != nullptr) cudaFreeHost(data_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace baton
