// The CUDA graphs of CudaModelRunner's decode path, one executable graph per
// DecodeGraphKey, captured lazily from a stream; and the pinned host staging
// buffer their per-step metadata is uploaded from.
//
// Capture rules the enqueued work must follow (cudaStreamCaptureModeThreadLocal
// on the runner's stream): kernel launches, cuBLAS calls on a handle with a
// fixed workspace, cudaMemsetAsync/cudaMemcpyAsync between device buffers
// only; no cudaMalloc/cudaFree, no synchronous copies, no synchronization,
// no host callbacks, and every pointer it reads stays at its address for the
// graph's lifetime.
//
// Thread safety: none (the runner's one stepping thread).
#ifndef BATON_WORKER_CUDA_DECODE_GRAPH_CACHE_H_
#define BATON_WORKER_CUDA_DECODE_GRAPH_CACHE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/cuda/decode_graph_plan.h"

namespace baton {

class DecodeGraphCache {
 public:
  DecodeGraphCache() = default;
  DecodeGraphCache(const DecodeGraphCache&) = delete;
  DecodeGraphCache& operator=(const DecodeGraphCache&) = delete;
  // Destroys every executable graph. REQUIRES: no launch is in flight (the
  // caller synchronized the stream).
  ~DecodeGraphCache();

  // The key's executable graph, or null when it was not captured (yet, or
  // its capture failed: see failed()).
  cudaGraphExec_t Find(const DecodeGraphKey& key) const;
  // True once a capture of `key` failed; the key then runs eagerly for good.
  bool failed(const DecodeGraphKey& key) const {
    return failures_.count(key) != 0;
  }

  // Captures what `enqueue` puts on `stream` (which must not be capturing
  // already and must be idle of work this capture depends on being ordered
  // after: the graph runs only when launched) and instantiates it as the
  // key's graph. Returns the graph. On any failure (begin/end capture,
  // `enqueue`'s own status, instantiation) the stream is out of capture
  // mode, the runtime's last error is cleared, the failure is remembered for
  // `key` and returned with "capturing the decode graph (bucket b, context
  // c)" in the message. REQUIRES: `key` has neither a graph nor a failure.
  absl::StatusOr<cudaGraphExec_t> Capture(
      const DecodeGraphKey& key, cudaStream_t stream,
      const std::function<absl::Status()>& enqueue);

  // Captured keys, in key order.
  std::vector<DecodeGraphKey> captured() const;
  // Failed keys with the reason, in key order.
  std::vector<std::pair<DecodeGraphKey, absl::Status>> failures() const;

 private:
  std::map<DecodeGraphKey, cudaGraphExec_t> execs_;
  std::map<DecodeGraphKey, absl::Status> failures_;
};

// int32 elements in page-locked host memory (cudaMallocHost), so that a
// cudaMemcpyAsync from it is truly asynchronous. Movable, not copyable.
class PinnedInt32Buffer {
 public:
  // ResourceExhausted naming the bytes when the pinned allocation fails.
  static absl::StatusOr<PinnedInt32Buffer> Create(int64_t elements);

  PinnedInt32Buffer() = default;
  PinnedInt32Buffer(PinnedInt32Buffer&& other) noexcept;
  PinnedInt32Buffer& operator=(PinnedInt32Buffer&& other) noexcept;
  PinnedInt32Buffer(const PinnedInt32Buffer&) = delete;
  PinnedInt32Buffer& operator=(const PinnedInt32Buffer&) = delete;
  ~PinnedInt32Buffer();

  std::span<int32_t> span() const { return {data_, size_}; }
  int32_t* data() const { return data_; }

 private:
  void Reset();

  int32_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace baton

#endif  // BATON_WORKER_CUDA_DECODE_GRAPH_CACHE_H_
