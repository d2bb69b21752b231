#include "common/async/executor.h"

#include <atomic>
#include <coroutine>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/async/task.h"
#include "gtest/gtest.h"

namespace baton::async {
namespace {

TEST(ExecutorTest, RunsEveryPostedWorkOnItsThreads) {
  std::atomic<int> ran{0};
  absl::Mutex mu;
  std::set<std::thread::id> threads;
  {
    Executor executor(3);
    EXPECT_EQ(executor.threads(), 3);
    for (int i = 0; i < 1000; ++i) {
      executor.Post([&] {
        {
          absl::MutexLock lock(&mu);
          threads.insert(std::this_thread::get_id());
        }
        ran.fetch_add(1);
      });
    }
  }  // the destructor runs what was posted
  EXPECT_EQ(ran.load(), 1000);
  EXPECT_LE(threads.size(), 3u);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u);
}

TEST(ExecutorTest, TimersRunOnceEitherAtTheirTimeOrWhenFired) {
  Executor executor(2);
  absl::Notification due;
  executor.After(absl::Milliseconds(1), [&] { due.Notify(); });
  due.WaitForNotification();

  std::atomic<int> runs{0};
  absl::Notification fired;
  const Executor::TimerId id = executor.After(absl::Hours(1), [&] {
    runs.fetch_add(1);
    fired.Notify();
  });
  EXPECT_TRUE(executor.Fire(id));
  fired.WaitForNotification();
  EXPECT_FALSE(executor.Fire(id));  // already ran
  EXPECT_EQ(runs.load(), 1);

  // A timer that was due is no longer pending either.
  absl::Notification ran;
  const Executor::TimerId soon =
      executor.After(absl::ZeroDuration(), [&] { ran.Notify(); });
  ran.WaitForNotification();
  EXPECT_FALSE(executor.Fire(soon));
}

TEST(ExecutorTest, PendingTimersAreDroppedAtDestruction) {
  std::atomic<bool> ran{false};
  {
    Executor executor(1);
    executor.After(absl::Hours(1), [&] { ran.store(true); });
  }
  EXPECT_FALSE(ran.load());
}

TEST(RendezvousTest, OnlyTheSecondToArriveGoesOn) {
  Rendezvous r;
  EXPECT_FALSE(r.Arrive());
  EXPECT_TRUE(r.Arrive());
  r.Reset();
  EXPECT_FALSE(r.Arrive());
}

// Suspends until the executor's timer resumes it, on a pool thread.
struct Sleep {
  Executor* executor;
  absl::Duration delay;
  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<> h) {
    executor->After(delay, [h] { h.resume(); });
  }
  void await_resume() const noexcept {}
};

Task<int> Leaf(Executor* executor, int x) {
  co_await Sleep{executor, absl::Milliseconds(1)};
  co_return x * 2;
}

Task<int> Middle(Executor* executor, int x) {
  int sum = 0;
  for (int i = 0; i < 3; ++i) sum += co_await Leaf(executor, x + i);
  co_return sum;
}

Detach Top(Executor* executor, int x, int* out, absl::Notification* done) {
  *out = co_await Middle(executor, x);
  done->Notify();
}

TEST(TaskTest, NestedTasksResumeTheirAwaiterWithTheResult) {
  Executor executor(2);
  std::vector<int> results(50);
  std::vector<absl::Notification> done(50);
  for (int i = 0; i < 50; ++i) Top(&executor, i, &results[i], &done[i]);
  for (int i = 0; i < 50; ++i) {
    done[i].WaitForNotification();
    EXPECT_EQ(results[i], 2 * (3 * i + 3)) << i;
  }
}

Task<int> Immediate(int x) { co_return x + 1; }

Detach TopImmediate(int* out) {
  *out = co_await Immediate(co_await Immediate(1));
}

TEST(TaskTest, ATaskThatNeverSuspendsRunsInline) {
  int out = 0;
  TopImmediate(&out);
  EXPECT_EQ(out, 3);
}

}  // namespace
}  // namespace baton::async
