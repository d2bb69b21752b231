// A worker's membership in the cluster: registers with the coordinator's
// control plane under the worker's own name and incarnation, then
// heartbeats its load and leases; registers again when the coordinator no
// longer knows this worker (restarted, or the lease expired).
#ifndef BATON_WORKER_SERVICE_REGISTRAR_H_
#define BATON_WORKER_SERVICE_REGISTRAR_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
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
  // the worker deregisters and stops heartbeating. `service` must outlive
  // the registrar. `credentials` (null: plaintext) reach the control plane.
  Registrar(const std::string& coordinator, v1::RegisterWorkerRequest request,
            WorkerService* service, std::function<absl::Status()> healthy,
            std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);
  ~Registrar();
  Registrar(const Registrar&) = delete;
  Registrar& operator=(const Registrar&) = delete;

 private:
  void Deregister();
  static void SetDeadline(grpc::ClientContext* context);
  void Run();

  std::unique_ptr<v1::Coordinator::Stub> stub_;
  const v1::RegisterWorkerRequest request_;
  WorkerService* const service_;
  const std::function<absl::Status()> healthy_;
  absl::Notification stop_;
  std::string worker_id_;  // empty until registered; Run's thread only
  uint64_t epoch_ = 0;
  absl::Duration interval_ = absl::Milliseconds(500);
  std::thread thread_;
};

}  // namespace baton

#endif  // BATON_WORKER_SERVICE_REGISTRAR_H_
