// A worker's membership with every coordinator replica of its cluster: one
// Registrar per replica. `--coordinator` names them as a comma-separated
// list of HOST:PORT; a HOST that is a DNS name (a Kubernetes headless
// Service, say) stands for every address it resolves to, looked up again
// every `resolve_interval`: a replica that appears gets a Registrar; one
// that left the name loses it once it is out of reach too (a draining
// replica leaves a Service's endpoints while its streams still run).
#ifndef BATON_WORKER_SERVICE_COORDINATOR_MEMBERSHIP_H_
#define BATON_WORKER_SERVICE_COORDINATOR_MEMBERSHIP_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/service/registrar.h"

namespace baton {

// One entry of --coordinator: "HOST:PORT" with HOST an IPv4 or bracketed
// IPv6 literal, or a DNS name.
struct CoordinatorEntry {
  std::string host;  // without brackets
  std::string port;
  bool is_name = false;  // a DNS name, resolved to every address it has
};

// Parses "HOST:PORT[,HOST:PORT...]"; InvalidArgument naming the entry.
absl::StatusOr<std::vector<CoordinatorEntry>> ParseCoordinatorList(
    const std::string& list);

// Every address `entry` stands for, as "IP:PORT" ("[IP]:PORT" for IPv6):
// itself for a literal; for a name, its IPv4 addresses, or its IPv6 ones
// when it has none (so a dual-stack replica is not registered with twice).
// Sorted; empty when the name does not resolve.
std::vector<std::string> ResolveCoordinator(const CoordinatorEntry& entry);

class CoordinatorMembership {
 public:
  // Makes the Registrar of one replica: its "IP:PORT" and, for one found
  // through a DNS name, that name (the TLS server name to verify).
  using MakeRegistrar = std::function<std::unique_ptr<Registrar>(
      const std::string& address, const std::string& server_name)>;

  // Starts a Registrar for every address the entries stand for now, and
  // (when an entry is a name) a thread that looks them up again every
  // `resolve_interval`.
  CoordinatorMembership(std::vector<CoordinatorEntry> entries,
                        MakeRegistrar make,
                        absl::Duration resolve_interval = absl::Seconds(10));
  // Stops looking up, then destroys every Registrar (each deregisters).
  ~CoordinatorMembership();
  CoordinatorMembership(const CoordinatorMembership&) = delete;
  CoordinatorMembership& operator=(const CoordinatorMembership&) = delete;

  // Every replica, and each one found later, gets DRAINING (see
  // Registrar::StartDraining). Thread-safe.
  void StartDraining();
  // Whether some replica still holds (or may hold: not yet answered) a
  // lease here while draining. Thread-safe.
  bool CoordinatorsHoldLeases();

 private:
  // Adds Registrars for new addresses, removes those of vanished ones.
  void Reconcile();

  const std::vector<CoordinatorEntry> entries_;
  const MakeRegistrar make_;
  const absl::Duration resolve_interval_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::unique_ptr<Registrar>> registrars_
      ABSL_GUARDED_BY(mu_);
  std::thread resolver_;
};

}  // namespace baton

#endif  // BATON_WORKER_SERVICE_COORDINATOR_MEMBERSHIP_H_
