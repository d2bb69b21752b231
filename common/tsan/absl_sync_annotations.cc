// ThreadSanitizer happens-before edges for the distribution's Abseil.
//
// Debian's libabsl_synchronization is not built with -fsanitize=thread, so
// TSan cannot see that absl::Mutex orders the accesses it guards and would
// report every guarded access as a race. In a BATON_SANITIZE=thread build
// the linker routes our calls to the functions below (-Wl,--wrap=SYMBOL, see
// common/tsan/CMakeLists.txt), which call the real function and tell TSan
// about the ordering: releasing a mutex (Unlock, or the unlock inside
// Await) publishes this thread's writes; acquiring it (Lock, the relock at
// the end of Await) receives them. Notification::Notify publishes to
// whoever sees the notification. Lock-order checking is not modelled.
#include <sanitizer/tsan_interface.h>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

// Declared with the C++ symbols' mangled names; `self` is the object.
#define BATON_WRAP(ret, mangled, ...)                       \
  extern "C" ret __real_##mangled(__VA_ARGS__);             \
  extern "C" ret __wrap_##mangled(__VA_ARGS__)

using absl::Condition;
using absl::Duration;

namespace {

// Await evaluates the caller's condition inside the real functions, on the
// waiting thread or on whichever thread unlocks, with the mutex held but
// without passing through the wrappers: the evaluation is bracketed with
// the mutex's acquire and release itself.
struct AcquiringCondition {
  void* mutex;
  const Condition* condition;

  static bool Eval(AcquiringCondition* self) {
    __tsan_acquire(self->mutex);
    const bool result = self->condition->Eval();
    __tsan_release(self->mutex);
    return result;
  }
};

}  // namespace

// absl::Mutex::Lock()
BATON_WRAP(void, _ZN4absl7debian35Mutex4LockEv, void* self) {
  __real__ZN4absl7debian35Mutex4LockEv(self);
  __tsan_acquire(self);
}
// absl::Mutex::Unlock()
BATON_WRAP(void, _ZN4absl7debian35Mutex6UnlockEv, void* self) {
  __tsan_release(self);
  __real__ZN4absl7debian35Mutex6UnlockEv(self);
}
// absl::Mutex::ReaderLock()
BATON_WRAP(void, _ZN4absl7debian35Mutex10ReaderLockEv, void* self) {
  __real__ZN4absl7debian35Mutex10ReaderLockEv(self);
  __tsan_acquire(self);
}
// absl::Mutex::ReaderUnlock()
BATON_WRAP(void, _ZN4absl7debian35Mutex12ReaderUnlockEv, void* self) {
  __tsan_release(self);
  __real__ZN4absl7debian35Mutex12ReaderUnlockEv(self);
}
// absl::Mutex::Await(const Condition&)
BATON_WRAP(void, _ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE, void* self,
           const Condition& cond) {
  AcquiringCondition wrapped{self, &cond};
  const Condition condition(&AcquiringCondition::Eval, &wrapped);
  __tsan_release(self);  // after `condition` is built: others read it
  __real__ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE(self, condition);
  __tsan_acquire(self);
}
// absl::Mutex::AwaitWithTimeout(const Condition&, Duration)
BATON_WRAP(bool,
           _ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE,
           void* self, const Condition& cond, Duration timeout) {
  AcquiringCondition wrapped{self, &cond};
  const Condition condition(&AcquiringCondition::Eval, &wrapped);
  __tsan_release(self);  // after `condition` is built: others read it
  const bool result =
      __real__ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE(
          self, condition, timeout);
  __tsan_acquire(self);
  return result;
}
// absl::Notification::Notify()
BATON_WRAP(void, _ZN4absl7debian312Notification6NotifyEv, void* self) {
  __tsan_release(self);
  __real__ZN4absl7debian312Notification6NotifyEv(self);
}
// absl::Notification::WaitForNotificationWithTimeout(Duration) const
BATON_WRAP(bool,
           _ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE,
           const void* self, Duration timeout) {
  const bool notified =
      __real__ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE(
          self, timeout);
  if (notified) __tsan_acquire(const_cast<void*>(self));
  return notified;
}
// absl::Notification::WaitForNotification() const
BATON_WRAP(void, _ZNK4absl7debian312Notification19WaitForNotificationEv,
           const void* self) {
  __real__ZNK4absl7debian312Notification19WaitForNotificationEv(self);
  __tsan_acquire(const_cast<void*>(self));
}
