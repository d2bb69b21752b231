// The engine thread of a worker: calls Engine::Step() while there is work
// and sleeps on a condition when idle, woken by Wake() (new work from the
// service, and the engine's own wakeup: a KV handoff confirmed on a sender
// thread) or after `idle_poll`, which only time-driven work needs (a
// handoff's timeout; blocks another thread freed for a waiting request)
// while the engine holds work, every second when it holds none: an idle
// worker wakes once a second (50 times with work in flight, 500 before the
// wakeup), which matters where dozens of workers share a host.
#ifndef BATON_WORKER_SERVICE_ENGINE_LOOP_H_
#define BATON_WORKER_SERVICE_ENGINE_LOOP_H_

#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/engine/engine.h"

namespace baton {

class EngineLoop {
 public:
  // Starts the thread; `engine` must outlive the loop.
  explicit EngineLoop(Engine* engine,
                      absl::Duration idle_poll = absl::Milliseconds(20));
  // Stops and joins the thread (requests in flight stay in the engine).
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // New work arrived (a submit, cancel or import): step now.
  void Wake();

 private:
  void Run();

  Engine* const engine_;
  const absl::Duration idle_poll_;
  absl::Mutex mu_;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace baton

#endif  // BATON_WORKER_SERVICE_ENGINE_LOOP_H_
