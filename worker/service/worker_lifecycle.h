// How a worker's process starts, reports its health and stops: the warm-up,
// the engine-fault watch and the drain on SIGTERM.
#ifndef BATON_WORKER_SERVICE_WORKER_LIFECYCLE_H_
#define BATON_WORKER_SERVICE_WORKER_LIFECYCLE_H_

#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/grpc/serving.h"
#include "worker/engine/engine.h"
#include "worker/service/coordinator_membership.h"
#include "worker/service/worker_service.h"

namespace baton {

// One short request before serving: faults in the weights and starts the
// thread pool, so the first client request does not pay for it; the prefix
// cache is emptied afterwards.
absl::Status WarmUp(Engine& engine);

// Turns `health` NOT_SERVING once the engine reports a device fault (polled
// every 250 ms).
class HealthWatch {
 public:
  HealthWatch(Engine* engine, HealthStatus* health);
  ~HealthWatch();
  HealthWatch(const HealthWatch&) = delete;
  HealthWatch& operator=(const HealthWatch&) = delete;

 private:
  void Run();

  Engine* const engine_;
  HealthStatus* const health_;
  absl::Notification stop_;
  std::thread thread_;
};

// The graceful part of a stop after `signal_number`: NOT_SERVING at once,
// DRAINING at every coordinator replica (nothing new is routed here), then
// waits until no request holds blocks here (prefills, decodes,
// reservations) and the replicas have seen every one of them end, `timeout`
// runs out, or a second signal comes. A `timeout` <= 0 returns at once.
// `membership` may be null (no coordinator).
void DrainWorker(int signal_number, absl::Duration timeout,
                 HealthStatus* health, WorkerService* service,
                 CoordinatorMembership* membership);

}  // namespace baton

#endif  // BATON_WORKER_SERVICE_WORKER_LIFECYCLE_H_
