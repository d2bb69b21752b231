#include "kernels/cpu/thread_pool.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace baton {
namespace {

// The pool whose range the current thread is running, if any.
thread_local const ThreadPool* tls_running_pool = nullptr;

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE,
          expected, nullptr, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE,
          INT32_MAX, nullptr, nullptr, 0);
}

inline void CpuRelax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

// Polls until `done()` is true or spin_us have passed; true if done.
template <typename Done>
bool Spin(int spin_us, Done done) {
  if (done()) return true;
  if (spin_us <= 0) return false;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      CpuRelax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<ThreadPool>> ThreadPool::Create(
    const ThreadPoolOptions& options) {
  if (options.num_threads < 1 || options.num_threads > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_threads must be in [1, 1024], got ", options.num_threads));
  }
  if (options.spin_us < 0 || options.spin_us > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("spin_us must be in [0, 1000000], got ", options.spin_us));
  }
  return std::unique_ptr<ThreadPool>(new ThreadPool(options));
}

ThreadPool::ThreadPool(const ThreadPoolOptions& options)
    : num_threads_(options.num_threads), spin_us_(options.spin_us) {
  workers_.reserve(num_threads_ - 1);
  for (int i = 1; i < num_threads_; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(call_mu_);
    stop_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_seq_cst);
    FutexWakeAll(&generation_);
  }
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::PartitionRange(int64_t n, int num_parts, int part,
                                int64_t* begin, int64_t* end) {
  auto bound = [&](int i) {
    const __int128 num = static_cast<__int128>(n) * i + (num_parts - 1);
    return static_cast<int64_t>(num / num_parts);
  };
  *begin = bound(part);
  *end = bound(part + 1);
}

void ThreadPool::Work() {
  for (;;) {
    uint64_t claim = claim_.load(std::memory_order_acquire);
    const int parts = ClaimParts(claim);
    const int part = ClaimNext(claim);
    // The range count comes from the claim word itself: a claim of a job
    // whose ranges are all taken stops here even if the next job's fields
    // (possibly with more ranges) are already being written.
    if (part >= parts) return;
    const RangeFn* fn = job_fn_.load(std::memory_order_acquire);
    const int64_t n = job_n_.load(std::memory_order_acquire);
    // The claim fixes the generation: fields read after the job was replaced
    // make the exchange fail (the acquire loads above order it after every
    // claim of the old job), so they are never used.
    if (!claim_.compare_exchange_weak(claim, claim + 1,
                                      std::memory_order_acq_rel)) {
      continue;
    }
    int64_t begin, end;
    PartitionRange(n, parts, part, &begin, &end);
    if (begin < end) (*fn)(begin, end);
    if (parts_done_.fetch_add(1, std::memory_order_acq_rel) + 1 ==
            static_cast<uint32_t>(parts) &&
        caller_sleeping_.load(std::memory_order_seq_cst) != 0) {
      FutexWakeAll(&parts_done_);
    }
  }
}

void ThreadPool::WorkerLoop() {
  uint32_t seen = 0;
  for (;;) {
    auto changed = [&] {
      return generation_.load(std::memory_order_acquire) != seen;
    };
    if (!Spin(spin_us_, changed)) {
      for (;;) {
        sleeping_workers_.fetch_add(1, std::memory_order_seq_cst);
        const uint32_t g = generation_.load(std::memory_order_seq_cst);
        if (g == seen) FutexWait(&generation_, seen);
        sleeping_workers_.fetch_sub(1, std::memory_order_seq_cst);
        if (changed()) break;
      }
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    tls_running_pool = this;
    Work();
    tls_running_pool = nullptr;
  }
}

void ThreadPool::ParallelFor(int64_t n, const RangeFn& fn) {
  if (n <= 0) return;
  if (num_threads_ == 1 || n == 1 || tls_running_pool == this) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> lock(call_mu_);
  const int parts = static_cast<int>(
      std::min<int64_t>(n, int64_t{num_threads_} * kPartsPerThread));
  job_fn_.store(&fn, std::memory_order_release);
  job_n_.store(n, std::memory_order_release);
  parts_done_.store(0, std::memory_order_relaxed);
  ++job_generation_;
  claim_.store(MakeClaim(job_generation_, parts), std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  if (sleeping_workers_.load(std::memory_order_seq_cst) != 0) {
    FutexWakeAll(&generation_);
  }
  tls_running_pool = this;
  Work();
  tls_running_pool = nullptr;

  const uint32_t target = static_cast<uint32_t>(parts);
  auto done = [&] {
    return parts_done_.load(std::memory_order_acquire) == target;
  };
  if (!Spin(spin_us_, done)) {
    for (;;) {
      caller_sleeping_.store(1, std::memory_order_seq_cst);
      const uint32_t d = parts_done_.load(std::memory_order_seq_cst);
      if (d != target) FutexWait(&parts_done_, d);
      caller_sleeping_.store(0, std::memory_order_seq_cst);
      if (done()) break;
    }
  }
  job_fn_.store(nullptr, std::memory_order_release);
}

}  // namespace baton
