// A worker's membership in the cluster: registers with one coordinator's
// control plane under the worker's own name and incarnation, then
// heartbeats its load and leases; registers again when the coordinator no
// longer knows this worker (restarted, or the lease expired). A worker
// serving several coordinator replicas runs one Registrar per replica; each
// reports, and frees on a fault, only the leases its replica took.
#ifndef BATON_WORKER_SERVICE_REGISTRAR_H_
#define BATON_WORKER_SERVICE_REGISTRAR_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

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
  // the control plane; `server_name`, when not empty, is the name its TLS
  // certificate must carry (a replica reached by the address a DNS name
  // resolved to).
  Registrar(const std::string& coordinator, v1::RegisterWorkerRequest request,
            WorkerService* service, std::function<absl::Status()> healthy,
            std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr,
            const std::string& server_name = "",
            std::function<void()> on_registered = nullptr);
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
  const std::string& server_name() const { return server_name_; }
  // Whether the replica is out of reach: its registration failed, or no
  // heartbeat was answered for its lease TTL (the leases it took here are
  // freed then). False again once it registers. Thread-safe.
  bool unreachable() const { return unreachable_.load(); }

 private:
  // `drain`: DRAINING instead of removed.
  void Deregister(bool drain = false);
  static void SetDeadline(grpc::ClientContext* context);
  void Run();
  void Log(const std::string& line) const;
  // The leases this replica took here (all, if it has no id).
  std::vector<std::string> OwnLeases();
  // Frees the leases this replica took here (as Cancel would).
  void CancelOwnLeases(const std::string& reason);

  const std::string coordinator_;
  const std::string server_name_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  const v1::RegisterWorkerRequest request_;
  WorkerService* const service_;
  const std::function<absl::Status()> healthy_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool drain_ ABSL_GUARDED_BY(mu_) = false;
  bool drain_noticed_ ABSL_GUARDED_BY(mu_) = false;  // by Run's thread
  std::atomic<int> coordinator_leases_{-1};
  std::atomic<bool> unreachable_{false};
  const std::function<void()> on_registered_;
  // How long an unhealthy worker waits for the coordinator to see its
  // requests end before it deregisters anyway.
  static constexpr absl::Duration kUnhealthyDrain = absl::Seconds(10);
  // Run's thread only:
  absl::Time unhealthy_since_ = absl::InfiniteFuture();
  bool drain_told_ = false;  // for this registration
  std::string worker_id_;    // empty until registered
  uint64_t epoch_ = 0;
  // The last prefix cache event this coordinator has (none: it gets a
  // snapshot with the next heartbeat; reset by every registration).
  std::optional<uint64_t> prefix_events_acked_;
  std::string coordinator_id_;  // the replica's, from its registration
  absl::Duration interval_ = absl::Milliseconds(500);
  // Heartbeats failing for this long: the coordinator has taken this
  // worker for DOWN (or is gone), so the leases it held here are freed.
  absl::Duration lease_ttl_ = absl::Seconds(3);
  absl::Time last_heartbeat_ok_ = absl::InfinitePast();
  std::thread thread_;
};

}  // namespace baton

#endif  // BATON_WORKER_SERVICE_REGISTRAR_H_
