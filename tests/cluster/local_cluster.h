// A Baton cluster of real processes on loopback for tests: one
// baton-coordinator and any number of prefill, decode and `both` workers
// with the default model, all on ports chosen by the kernel.
#ifndef BATON_TESTS_CLUSTER_LOCAL_CLUSTER_H_
#define BATON_TESTS_CLUSTER_LOCAL_CLUSTER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "baton/v1/api.grpc.pb.h"
#include "baton/v1/worker.grpc.pb.h"
#include "common/grpc/tls.h"
#include "tests/cluster/child_process.h"

namespace baton::testing {

struct LocalClusterOptions {
  // Coordinator replicas serving the cluster (each worker registers with
  // all of them); replica 0 is the one address() and baton() name.
  int coordinators = 1;
  int prefill = 1;
  int decode = 1;
  int both = 0;
  // KV pool of every worker, and of decode (and both) workers if > 0.
  int64_t kv_cache_mib = 64;
  int64_t decode_kv_cache_mib = 0;
  int threads = 1;
  int heartbeat_ms = 100;
  int lease_ttl_ms = 1000;
  // Every worker's --drain_timeout_s: 0 (stop at SIGTERM at once, as the
  // fault tests expect) unless a test drains.
  int drain_timeout_s = 0;
  // The coordinator's --drain_timeout_s (0: SIGTERM ends its calls at once).
  int coordinator_drain_timeout_s = 0;
  // The coordinator's --local_prefill_tokens (0, its default: always
  // split).
  int64_t local_prefill_tokens = 0;
  // Extra baton-coordinator flags, e.g. "--queue_timeout_ms=500".
  std::vector<std::string> coordinator_flags;
  // Extra flags of every worker, e.g. "--fault=prefill_step:stop".
  std::vector<std::string> worker_flags;
  // Extra flags of single workers, by index in workers() (the prefill
  // workers, then the decode, then the both workers).
  std::map<int, std::vector<std::string>> flags_of_worker;
  // Serve the OpenAI-compatible HTTP API too (--http_listen=127.0.0.1:0);
  // its address is http_address().
  bool http = false;
  // Register the workers and wait until all are healthy.
  bool wait_healthy = true;
  // How the cluster's own clients (baton(), workers()[i].stub) connect when
  // the processes get TLS or API-key flags (in coordinator_flags /
  // worker_flags): client-side TLS files for the public port and for the
  // control plane, and the API key the public calls carry.
  TlsFiles public_client_tls;
  TlsFiles control_client_tls;
  std::string api_key;
};

class LocalCluster {
 public:
  struct Worker {
    std::string role;     // "prefill", "decode", "both"
    std::string address;  // of its Worker service
    std::unique_ptr<ChildProcess> process;
    std::unique_ptr<v1::Worker::Stub> stub;
  };

  // Starts the coordinator, then every worker; waits until all workers are
  // registered and healthy (when options.wait_healthy).
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(
      const LocalClusterOptions& options);
  // SIGTERM to every process, SIGKILL after 10 s.
  ~LocalCluster();

  // The coordinator's public port (baton.v1.Baton); of replica `r`.
  const std::string& address(int r = 0) const { return replica(r).address; }
  // The coordinator's control plane (baton.v1.Coordinator; workers).
  const std::string& control_address(int r = 0) const {
    return replica(r).control_address;
  }
  // "127.0.0.1:PORT" of the HTTP API; empty unless options.http.
  const std::string& http_address(int r = 0) const {
    return replica(r).http_address;
  }
  v1::Baton::Stub& baton(int r = 0) {
    return *coordinators_.at(static_cast<size_t>(r)).baton;
  }
  ChildProcess& coordinator_process(int r = 0) {
    return *coordinators_.at(static_cast<size_t>(r)).process;
  }
  int coordinator_count() const {
    return static_cast<int>(coordinators_.size());
  }
  std::vector<Worker>& workers() { return workers_; }

  // Until GetClusterStatus of every running replica lists `count` HEALTHY
  // workers.
  absl::Status WaitHealthy(int count, absl::Duration timeout);
  // Until every running worker reports kv_blocks_free == kv_blocks_total
  // and no leased request, and every running replica no active request. The
  // error names the first worker still holding blocks, with its numbers.
  absl::Status WaitAllFree(absl::Duration timeout);
  // SIGTERM to every running process; OK if each exits with status 0 (a
  // crash at shutdown, or a leak LeakSanitizer reports at exit, is an error
  // naming the process).
  absl::Status Stop();
  // The same for worker `index` alone (continued first if it is stopped).
  absl::Status StopWorker(int index);
  // SIGKILL to worker `index`, reaped before returning.
  void Kill(int index);
  // SIGKILL to the coordinator (replica 0), then a new one on the same
  // public and control ports (the workers find it there and register
  // again); returns once it listens, without waiting for the workers.
  absl::Status RestartCoordinator();
  // SIGKILL to coordinator replica `r`, reaped before returning.
  void KillCoordinator(int r);
  // Until a worker stops itself (--fault=POINT:stop); its index. The
  // timeout only guards against a hang: the stop is an event of the
  // request, not of the clock. DeadlineExceeded naming the timeout.
  absl::StatusOr<int> WaitForStoppedWorker(absl::Duration timeout);
  // Until worker `index` reports `count` leased requests (a decode worker's
  // reservations: the coordinator makes them beside the Prefill, so a
  // prefill worker stopped at its first step does not imply them). The
  // error names the count last seen.
  absl::Status WaitForLeases(int index, int count, absl::Duration timeout);

  // Starts one more worker of `role` ("prefill", "decode", "both") with the
  // cluster's options plus `extra_flags`, once it listens; its index in
  // workers(). It registers on its own: WaitHealthy(n) waits for that.
  absl::StatusOr<int> AddWorker(
      const std::string& role,
      const std::vector<std::string>& extra_flags = {});

  // The index of the worker with this address, or -1.
  int WorkerIndex(const std::string& address) const;

 private:
  LocalCluster() = default;

  struct Coordinator {
    std::vector<std::string> argv;
    std::unique_ptr<ChildProcess> process;
    std::string address;
    std::string control_address;
    std::string http_address;
    std::unique_ptr<v1::Baton::Stub> baton;
  };
  const Coordinator& replica(int r) const {
    return coordinators_.at(static_cast<size_t>(r));
  }
  // Spawns replica `r` from its argv and reads its addresses (the ports it
  // bound become part of its argv, for restarts).
  absl::Status SpawnCoordinator(int r);
  // GetClusterStatus of replica `c`, with a short deadline.
  static grpc::Status ClusterStatus(Coordinator& c,
                                    v1::GetClusterStatusResponse* status);
  // Every replica's control address, comma-separated (--coordinator).
  std::string ControlAddresses() const;

  // A worker's command line: the cluster's options, then `extra`.
  std::vector<std::string> WorkerArgv(
      const std::string& role, const std::vector<std::string>& extra) const;
  // Waits for a started worker's first line and adds it to workers_.
  absl::Status AdoptWorker(const std::string& role,
                           std::unique_ptr<ChildProcess> process);

  LocalClusterOptions options_;
  std::shared_ptr<grpc::ChannelCredentials> public_credentials_;
  std::shared_ptr<grpc::ChannelCredentials> control_credentials_;
  std::vector<Coordinator> coordinators_;
  std::vector<Worker> workers_;
};

// The directory holding baton-coordinator and baton-worker.
std::string BinaryDir();

}  // namespace baton::testing

#endif  // BATON_TESTS_CLUSTER_LOCAL_CLUSTER_H_
