// C++20 coroutines for flows that wait on RPCs and timers without holding a
// thread (the coordinator's Generate calls):
//
//   Task<T>  a coroutine another coroutine co_awaits; it starts when
//            awaited and resumes its awaiter when it returns (symmetric
//            transfer: no stack growth, no thread hop).
//   Detach   the return type of a top-level coroutine: it starts at once
//            and frees its own frame when it returns.
//
// Exceptions are not used (an escaping one aborts). Where a coroutine is
// resumed, after a suspension, is up to what it awaited (e.g. an
// Executor's thread). Keep every co_await in a statement of its own or a
// plain condition: GCC 12 miscompiles one inside a conditional expression
// (`c ? x : co_await y`).
#ifndef BATON_COMMON_ASYNC_TASK_H_
#define BATON_COMMON_ASYNC_TASK_H_

#include <coroutine>
#include <exception>
#include <optional>
#include <utility>

namespace baton::async {

template <typename T>
class [[nodiscard]] Task {
 public:
  struct promise_type {
    std::optional<T> value;
    std::coroutine_handle<> awaiter;

    Task get_return_object() {
      return Task(std::coroutine_handle<promise_type>::from_promise(*this));
    }
    std::suspend_always initial_suspend() noexcept { return {}; }
    struct FinalAwaiter {
      bool await_ready() noexcept { return false; }
      std::coroutine_handle<> await_suspend(
          std::coroutine_handle<promise_type> h) noexcept {
        std::coroutine_handle<> next = h.promise().awaiter;
        return next ? next : std::noop_coroutine();
      }
      void await_resume() noexcept {}
    };
    FinalAwaiter final_suspend() noexcept { return {}; }
    void return_value(T v) { value.emplace(std::move(v)); }
    void unhandled_exception() noexcept { std::terminate(); }
  };

  Task(Task&& other) noexcept : handle_(std::exchange(other.handle_, {})) {}
  Task& operator=(Task&&) = delete;
  ~Task() {
    if (handle_) handle_.destroy();
  }

  bool await_ready() const noexcept { return false; }
  std::coroutine_handle<> await_suspend(std::coroutine_handle<> awaiter) {
    handle_.promise().awaiter = awaiter;
    return handle_;
  }
  T await_resume() { return std::move(*handle_.promise().value); }

 private:
  explicit Task(std::coroutine_handle<promise_type> handle) : handle_(handle) {}
  std::coroutine_handle<promise_type> handle_;
};

struct Detach {
  struct promise_type {
    Detach get_return_object() noexcept { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
  };
};

}  // namespace baton::async

#endif  // BATON_COMMON_ASYNC_TASK_H_
