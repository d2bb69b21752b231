// A fixed pool of compute threads for the CPU kernels.
#ifndef BATON_KERNELS_CPU_THREAD_POOL_H_
#define BATON_KERNELS_CPU_THREAD_POOL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace baton {

struct ThreadPoolOptions {
  // --- behaviour ---
  // Workers, the thread that calls ParallelFor included; in [1, 1024].
  int num_threads = 1;

  // --- performance ---
  // How long an idle worker (and a caller waiting for workers) polls before
  // it sleeps on a futex, in microseconds; in [0, 1000000]. Decode steps are a
  // few milliseconds of back-to-back kernels, so a short spin avoids a
  // wake-up syscall per kernel.
  int spin_us = 200;
};

class ThreadPool {
 public:
  using RangeFn = std::function<void(int64_t begin, int64_t end)>;

  // InvalidArgument if an option is out of range.
  static absl::StatusOr<std::unique_ptr<ThreadPool>> Create(
      const ThreadPoolOptions& options);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn on the static partition of [0, n) into P = min(n, 4 *
  // num_threads()) contiguous ranges, range i = [ceil(i*n/P),
  // ceil((i+1)*n/P)); empty ranges are not called. The partition depends only
  // on (n, num_threads()); which thread runs a range does not: the caller and
  // the workers claim ranges as they become free, so a worker the OS has not
  // scheduled (an oversubscribed machine) never holds the call up unless it
  // has already started a range. Returns when every range has returned.
  // Concurrent callers are serialised; a call from inside fn runs the whole
  // range inline on the calling thread. fn must not throw.
  void ParallelFor(int64_t n, const RangeFn& fn);

  // Range i of the static partition above.
  static void PartitionRange(int64_t n, int num_parts, int part, int64_t* begin,
                             int64_t* end);

 private:
  static constexpr int kPartsPerThread = 4;
  static_assert(1024 * kPartsPerThread < (1 << 16),
                "a job's range count must fit a claim word's 16 bits");
  // A claim word: job generation (bits 32..63), the job's range count (bits
  // 16..31; at most 4 * 1024) and its next unclaimed range (bits 0..15).
  static constexpr uint64_t MakeClaim(uint32_t generation, int parts) {
    return (uint64_t{generation} << 32) | (static_cast<uint64_t>(parts) << 16);
  }
  static constexpr int ClaimParts(uint64_t claim) {
    return static_cast<int>((claim >> 16) & 0xffff);
  }
  static constexpr int ClaimNext(uint64_t claim) {
    return static_cast<int>(claim & 0xffff);
  }

  explicit ThreadPool(const ThreadPoolOptions& options);
  void WorkerLoop();
  // Claims and runs ranges of the current job until none is left.
  void Work();

  const int num_threads_;
  const int spin_us_;
  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // held for the whole of a top-level ParallelFor

  // The current job; written by the caller before claim_ is published.
  std::atomic<const RangeFn*> job_fn_{nullptr};
  std::atomic<int64_t> job_n_{0};
  uint32_t job_generation_ = 0;  // caller only, under call_mu_
  std::atomic<bool> stop_{false};

  // MakeClaim(job generation, ranges) + next unclaimed range.
  alignas(64) std::atomic<uint64_t> claim_{0};
  alignas(64) std::atomic<uint32_t> parts_done_{0};
  alignas(64) std::atomic<uint32_t> generation_{0};  // wakes workers
  alignas(64) std::atomic<uint32_t> sleeping_workers_{0};
  alignas(64) std::atomic<uint32_t> caller_sleeping_{0};
};

}  // namespace baton

#endif  // BATON_KERNELS_CPU_THREAD_POOL_H_
