// Happens-before annotations for ThreadSanitizer builds; no-ops otherwise.
//
// Debian's gRPC is not built with TSan, so TSan cannot see that a service
// object built on one thread is handed to gRPC's handler threads by the
// server: a service releases itself once constructed, and every RPC
// handler acquires it on entry.
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

#endif  // BATON_COMMON_TSAN_ANNOTATIONS_H_
