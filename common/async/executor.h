// A small fixed pool of threads that runs posted work and timers, so that
// flows which mostly wait (on RPCs, on backoffs) hold no thread while they
// wait: coroutines (common/async/task.h) suspend on an RPC or a timer and
// are resumed here by its completion.
#ifndef BATON_COMMON_ASYNC_EXECUTOR_H_
#define BATON_COMMON_ASYNC_EXECUTOR_H_

#include <atomic>
#include <coroutine>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace baton::async {

// The hand-off between a coroutine that starts an operation and the thread
// that completes it, which may come first: both call Arrive(), and the
// second to arrive resumes the coroutine (the completion by posting it to
// the executor; the coroutine by not suspending), so neither touches the
// other's state after its own arrival.
class Rendezvous {
 public:
  void Reset() { arrived_.store(false, std::memory_order_relaxed); }
  // True for the second of the two.
  bool Arrive() { return arrived_.exchange(true, std::memory_order_acq_rel); }

 private:
  std::atomic<bool> arrived_{false};
};

class Executor {
 public:
  using TimerId = uint64_t;

  // `threads` >= 1 run posted work; one more thread keeps the timers.
  explicit Executor(int threads);
  // Drops the timers still pending (their work never runs), runs the work
  // already posted, then joins the threads. Nothing may be posted from
  // outside the pool once the destructor started.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Runs `work` on one of the pool's threads, in posting order per poster.
  void Post(absl::AnyInvocable<void() &&> work);
  // Resumes `handle` on one of the pool's threads.
  void Resume(std::coroutine_handle<> handle);

  // Runs `work` on the pool after `delay` (at once if <= 0), unless Fire
  // ran it first. Ids are never reused.
  TimerId After(absl::Duration delay, absl::AnyInvocable<void() &&> work);
  // Runs timer `id`'s work now (posted) instead of at its time; false if
  // it already ran or was posted.
  bool Fire(TimerId id);

  int threads() const { return static_cast<int>(workers_.size()); }

 private:
  void WorkerLoop();
  void TimerLoop();

  absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  absl::Mutex timer_mu_ ABSL_ACQUIRED_AFTER(mu_);
  struct Timer {
    absl::Time due;
    absl::AnyInvocable<void() &&> work;
  };
  std::map<TimerId, Timer> timers_ ABSL_GUARDED_BY(timer_mu_);
  // (due, id) of every pending timer, earliest first.
  std::set<std::pair<absl::Time, TimerId>> due_ ABSL_GUARDED_BY(timer_mu_);
  TimerId next_timer_ ABSL_GUARDED_BY(timer_mu_) = 1;
  bool timers_stopping_ ABSL_GUARDED_BY(timer_mu_) = false;

  std::vector<std::thread> workers_;
  std::thread timer_thread_;
};

}  // namespace baton::async

#endif  // BATON_COMMON_ASYNC_EXECUTOR_H_
