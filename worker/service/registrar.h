// A worker's membership in the cluster: registers with the coordinator's
// control plane under the worker's own name and incarnation, then
// heartbeats its load and leases; registers again when the coordinator no
// longer knows this worker (restarted, or the lease expired).
#ifndef BATON_WORKER_SERVICE_REGISTRAR_H_
#define BATON_WORKER_SERVICE_REGISTRAR_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "baton/v1/worker.grpc.pb.h"
#include "worker/service/worker_service.h"

namespace baton {

// Sets request->worker_id (`worker_id`, or "w-" and 8 random hex digits
// when empty) and a random non-zero incarnation.
void SetWorkerIdentity(const std::string& worker_id,
                       v1::RegisterWorkerRequest* request);

class Registrar {
 public:
  // Registers `request` at `coordinator` (HOST:PORT of its control plane)
  // and heartbeats on its own thread until destroyed, then deregisters.
  // `healthy` is polled before every heartbeat; once it returns an error
  // the worker drains (the coordinator routes nothing new to it) until the
  // coordinator holds no lease here, so the requests that failed reach it
  // with their own error first, then deregisters and stops heartbeating.
  // `service` must outlive the registrar. `credentials` (null: plaintext) reach
  // the control plane.
  Registrar(const std::string& coordinator, v1::RegisterWorkerRequest request,
            WorkerService* service, std::function<absl::Status()> healthy,
            std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);
  ~Registrar();
  Registrar(const Registrar&) = delete;
  Registrar& operator=(const Registrar&) = delete;

  // From now on the coordinator routes nothing new here (the worker is
  // DRAINING there, told at once and again after any re-registration);
  // heartbeats go on, so the requests in flight keep their leases.
  // Thread-safe.
  void StartDraining();
  // While draining: the coordinator's count of live leases on this worker
  // at its last answer (-1 before one; 0 once a drain call fails: an
  // unreachable coordinator holds nothing to wait for). Thread-safe.
  int coordinator_leases() const { return coordinator_leases_.load(); }

 private:
  // `drain`: DRAINING instead of removed.
  void Deregister(bool drain = false);
  static void SetDeadline(grpc::ClientContext* context);
  void Run();

  std::unique_ptr<v1::Coordinator::Stub> stub_;
  const v1::RegisterWorkerRequest request_;
  WorkerService* const service_;
  const std::function<absl::Status()> healthy_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool drain_ ABSL_GUARDED_BY(mu_) = false;
  bool drain_noticed_ ABSL_GUARDED_BY(mu_) = false;  // by Run's thread
  std::atomic<int> coordinator_leases_{-1};
  // How long an unhealthy worker waits for the coordinator to see its
  // requests end before it deregisters anyway.
  static constexpr absl::Duration kUnhealthyDrain = absl::Seconds(10);
  // Run's thread only:
  absl::Time unhealthy_since_ = absl::InfiniteFuture();
  bool drain_told_ = false;  // for this registration
  std::string worker_id_;    // empty until registered
  uint64_t epoch_ = 0;
  absl::Duration interval_ = absl::Milliseconds(500);
  std::thread thread_;
};

}  // namespace baton

#endif  // BATON_WORKER_SERVICE_REGISTRAR_H_
