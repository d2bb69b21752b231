// --mutex_deadlock_detection, shared by the servers: Debian's Abseil checks
// every mutex acquisition against a global lock graph unless told not to,
// which costs a loaded coordinator a seventh of its CPU and its tail
// latency. Servers run without it; the tests turn it on.
#ifndef BATON_COMMON_MUTEX_CHECKS_H_
#define BATON_COMMON_MUTEX_CHECKS_H_

namespace baton {

// Sets Abseil's deadlock detection from --mutex_deadlock_detection (abort
// on a lock-order cycle when on, no checks when off). Call after parsing
// the flags, before any thread starts.
void ApplyMutexChecksFlag();

}  // namespace baton

#endif  // BATON_COMMON_MUTEX_CHECKS_H_
