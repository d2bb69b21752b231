// Happens-before annotations for ThreadSanitizer builds; no-ops otherwise.
//
// Debian's gRPC is not built with TSan, so TSan cannot see that a service
// object built on one thread is handed to gRPC's handler threads by the
// server: a service releases itself once constructed, and every RPC
// handler acquires it on entry. A handler's return is ordered before the
// service's destructor by the server's Shutdown (it returns only after every
// handler did): TsanHandlerScope releases a second address of the service
// on return, which the destructor acquires (TsanAfterHandlers). That second
// address keeps handlers unordered among themselves, as they are.
#ifndef BATON_COMMON_TSAN_ANNOTATIONS_H_
#define BATON_COMMON_TSAN_ANNOTATIONS_H_

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define BATON_TSAN_RELEASE(addr) \
  __tsan_release(const_cast<void*>(static_cast<const void*>(addr)))
#define BATON_TSAN_ACQUIRE(addr) \
  __tsan_acquire(const_cast<void*>(static_cast<const void*>(addr)))
#else
#define BATON_TSAN_RELEASE(addr) static_cast<void>(addr)
#define BATON_TSAN_ACQUIRE(addr) static_cast<void>(addr)
#endif

namespace baton {

// The address a service's handlers release on return: one byte into the
// service (no synchronization object of its own lives there).
inline const void* TsanHandlersEnded(const void* service) {
  return static_cast<const char*>(service) + 1;
}

// An RPC handler's hold on its service, for the length of the handler.
class TsanHandlerScope {
 public:
  explicit TsanHandlerScope(const void* service) : service_(service) {
    BATON_TSAN_ACQUIRE(service_);
  }
  ~TsanHandlerScope() { BATON_TSAN_RELEASE(TsanHandlersEnded(service_)); }
  TsanHandlerScope(const TsanHandlerScope&) = delete;
  TsanHandlerScope& operator=(const TsanHandlerScope&) = delete;

 private:
  const void* const service_;
};

// In a service's destructor, before it tears down what handlers use.
inline void TsanAfterHandlers(const void* service) {
  BATON_TSAN_ACQUIRE(TsanHandlersEnded(service));
}

}  // namespace baton

#endif  // BATON_COMMON_TSAN_ANNOTATIONS_H_
