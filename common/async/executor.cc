#include "common/async/executor.h"

#include "common/check.h"

namespace baton::async {

Executor::Executor(int threads) {
  BATON_CHECK(threads >= 1)
      << "Executor: threads must be >= 1, got " << threads;
  workers_.reserve(static_cast<size_t>(threads));
  for (int i = 0; i < threads; ++i)
    workers_.emplace_back([this] { WorkerLoop(); });
  timer_thread_ = std::thread([this] { TimerLoop(); });
}

Executor::~Executor() {
  {
    absl::MutexLock lock(&timer_mu_);
    timers_stopping_ = true;
    timers_.clear();
    due_.clear();
  }
  timer_thread_.join();
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

void Executor::Post(absl::AnyInvocable<void() &&> work) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(work));
}

void Executor::Resume(std::coroutine_handle<> handle) {
  Post([handle] { handle.resume(); });
}

void Executor::WorkerLoop() {
  while (true) {
    absl::AnyInvocable<void() &&> work;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Executor* e) {
            e->mu_.AssertHeld();
            return e->stopping_ || !e->queue_.empty();
          },
          this));
      // Posted work runs even while stopping: a coroutine resumed by it
      // finishes.
      if (queue_.empty()) return;
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    std::move(work)();
  }
}

Executor::TimerId Executor::After(absl::Duration delay,
                                  absl::AnyInvocable<void() &&> work) {
  absl::MutexLock lock(&timer_mu_);
  const TimerId id = next_timer_++;
  if (timers_stopping_) return id;
  const absl::Time due = absl::Now() + delay;
  timers_.emplace(id, Timer{due, std::move(work)});
  due_.emplace(due, id);
  return id;
}

bool Executor::Fire(TimerId id) {
  absl::AnyInvocable<void() &&> work;
  {
    absl::MutexLock lock(&timer_mu_);
    auto it = timers_.find(id);
    if (it == timers_.end()) return false;
    due_.erase(std::make_pair(it->second.due, id));
    work = std::move(it->second.work);
    timers_.erase(it);
  }
  Post(std::move(work));
  return true;
}

void Executor::TimerLoop() {
  absl::MutexLock lock(&timer_mu_);
  while (!timers_stopping_) {
    const absl::Time now = absl::Now();
    std::vector<absl::AnyInvocable<void() &&>> ready;
    while (!due_.empty() && due_.begin()->first <= now) {
      const TimerId id = due_.begin()->second;
      due_.erase(due_.begin());
      auto it = timers_.find(id);
      ready.push_back(std::move(it->second.work));
      timers_.erase(it);
    }
    if (!ready.empty()) {
      timer_mu_.Unlock();
      for (auto& work : ready) Post(std::move(work));
      timer_mu_.Lock();
      continue;
    }
    // Wakes for a stop, an earlier timer, or the next one's time.
    std::pair<Executor*, absl::Time> wait(
        this, due_.empty() ? absl::InfiniteFuture() : due_.begin()->first);
    // (AwaitWithTimeout, not AwaitWithDeadline: the TSan build annotates
    // the former, common/tsan/tsan.cmake.)
    timer_mu_.AwaitWithTimeout(
        absl::Condition(
            +[](std::pair<Executor*, absl::Time>* w) {
              Executor* e = w->first;
              e->timer_mu_.AssertHeld();
              return e->timers_stopping_ ||
                     (!e->due_.empty() && e->due_.begin()->first < w->second);
            },
            &wait),
        wait.second - absl::Now());
  }
}

}  // namespace baton::async
