// The coordinator's shared state and the work that is not tied to one RPC:
// the worker registry, the request state machine (owner of every KV lease),
// the routing policy, one gRPC channel per worker, and a sweeper thread
// that turns expired worker leases, request deadlines and stuck KV transfers
// into state-machine edges, performs their cleanup on the workers
// (Worker.Cancel) and aborts the affected calls.
//
// Requests are driven by GenerateCall (generate_call.h); they register here
// so the sweeper can abort them.
#ifndef BATON_COORDINATOR_SERVICE_CLUSTER_H_
#define BATON_COORDINATOR_SERVICE_CLUSTER_H_

#include <grpcpp/security/credentials.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "baton/v1/worker.grpc.pb.h"
#include "common/async/executor.h"
#include "common/metrics/metrics.h"
#include "coordinator/admission.h"
#include "coordinator/clock.h"
#include "coordinator/prefix_index.h"
#include "coordinator/request_state_machine.h"
#include "coordinator/routing_policy.h"
#include "coordinator/service/coordinator_metrics.h"
#include "coordinator/service/request_limits.h"
#include "coordinator/service/served_model.h"
#include "coordinator/worker_registry.h"

namespace baton::coordinator {

// On ClaimDecode's refusal to send a request to wait while grants are in
// flight.
inline constexpr absl::string_view kGrantsInFlightPayload =
    "baton.grants_in_flight";

// Payload type URL on the abort status of calls ended by Shutdown().
inline constexpr absl::string_view kShutdownPayload =
    "type.baton.dev/baton.CoordinatorShutdown";

// Cluster::ClaimDecode's prefill on the decode worker itself.
struct LocalPrefill {
  // Workers that failed this request's prefill: never chosen.
  std::vector<WorkerId> not_on;
  // Set when the claim started the attempt colocated on the picked worker.
  bool chosen = false;
};

struct ClusterOptions {
  WorkerRegistryOptions registry;
  // "least_loaded" (default) or "round_robin".
  std::string policy = "least_loaded";
  // least_loaded's weight of a prompt token found in a worker's prefix
  // cache against a prompt token queued there (routing_policy.h); >= 0.
  double prefix_weight = 1.0;
  // How often leases, deadlines, queue and transfer timers are checked.
  absl::Duration sweep_interval = absl::Milliseconds(50);
  // How long a request may wait for a decode worker with room before it
  // fails with RESOURCE_EXHAUSTED.
  absl::Duration queue_timeout = absl::Seconds(30);
  // A request in TRANSFERRING for longer than this fails (DEADLINE_EXCEEDED)
  // and both workers free its blocks.
  absl::Duration transfer_timeout = absl::Seconds(30);
  // Deadline of the unary worker RPCs (ReserveKv, Cancel).
  absl::Duration worker_rpc_timeout = absl::Seconds(5);
  // What one request may ask for, checked before any worker sees it.
  RequestLimits limits;
  // Where the coordinator's metrics are registered; null: the process-wide
  // metrics::Registry(). Must outlive the cluster.
  prometheus::Registry* metrics_registry = nullptr;
  // How the coordinator reaches workers' control ports (mutual TLS when the
  // control plane has certificates); null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> worker_credentials;
  // This replica's id among the coordinators serving one cluster: it tags
  // the leases this replica takes on workers and prefixes its request ids.
  // Empty: "c-" and 8 random hex digits.
  std::string coordinator_id;
  // Times one request may move to another decode worker after tokens were
  // streamed (its decode worker, or the prefill worker still handing off
  // its KV, failed): the new worker continues from the tokens the client
  // has, so the output is the one a fault-free run gives. 0: never.
  int max_migrations = 2;
  // Attempts a request may take before its first token reaches the client
  // (a worker failed each of the others); >= 1.
  int max_attempts = 3;
  // Split serving: send Prefill at once and make the decode worker's
  // reservation beside it (ReserveKv, then SetKvTarget on the prefill
  // worker, which computes meanwhile), instead of reserving first: one
  // round trip less before the first token. A reservation refused then
  // ends that attempt, and the next one reserves first. Only a request's
  // first attempt, and only when the pool had room in the coordinator's
  // view (a request that waits for room reserves first), and only to a
  // decode worker whose KV is in host memory (one that registered a
  // kv_device offers device-direct transports, which the prefill worker
  // picks only from a reservation it has before it starts).
  bool overlap_reserve_kv = true;
  // Split serving: a request whose prompt a decode worker with room already
  // holds all but at most this many tokens of (at least one block cached
  // there) is served colocated on that decode worker, which prefills only
  // the rest: no prefill worker, no KV transfer, no block computed twice
  // (a conversation's next turn, whose history the decode worker of the
  // last turn holds, answer included). 0 (the default): always split. It
  // moves that compute onto the decode worker: worth it where the decode
  // worker has compute to spare (a GPU) or the network is the bottleneck.
  int64_t local_prefill_tokens = 0;
  // Threads that run every Generate call's coroutine (1..64): calls hold
  // none while they wait, so a few serve thousands of streams.
  int call_threads = 4;
  // Which requests are refused on arrival (admission.h).
  AdmissionOptions admission;
};

// A running request as the sweeper sees it.
class CallHandle {
 public:
  virtual ~CallHandle() = default;
  // The state machine ended attempt `attempt_id` on the coordinator's side
  // (its cleanup done or under way; the request went on under a new
  // attempt, or ended with `status`): stop every worker RPC of that attempt
  // (an attempt that is no longer the call's current one is ignored); the
  // call asks the state machine what comes next. With an empty id, the
  // whole request ends (client, deadline, shutdown), reporting `status` to
  // the client. Thread-safe, idempotent, never blocks.
  virtual void Abort(absl::string_view attempt_id,
                     const absl::Status& status) = 0;
};

class Cluster {
 public:
  // InvalidArgument for bad options or an unknown policy.
  static absl::StatusOr<std::unique_ptr<Cluster>> Create(
      const ClusterOptions& options, std::unique_ptr<ServedModel> model,
      const Clock* clock);
  // Shutdown(), then stops the sweeper.
  ~Cluster();
  // Refuses new requests (UNAVAILABLE, retriable) and waits up to `timeout`
  // for the running calls to end on their own; returns how many still run.
  int Drain(absl::Duration timeout);
  // Refuses new requests, ends every running call and waits up to 10 s for
  // the calls to end: a client that has tokens gets a result with
  // finish_reason CANCELLED, one without gets UNAVAILABLE (retriable; the
  // abort status carries kShutdownPayload). Idempotent.
  void Shutdown();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  const ClusterOptions& options() const { return options_; }
  const Clock& clock() const { return *clock_; }
  const ServedModel& model() const { return *model_; }
  WorkerRegistry& registry() { return *registry_; }
  // What each worker's prefix cache holds, from its heartbeats.
  PrefixIndex& prefix_index() { return prefix_index_; }
  RequestStateMachine& requests() { return requests_; }
  RoutingPolicy& policy() { return *policy_; }
  // Where the Generate calls' coroutines run (a few threads for every call;
  // the calls hold none while they wait on a worker or a backoff).
  async::Executor& executor() { return *executor_; }
  // The coordinator's Prometheus metrics (healthy workers are refreshed
  // from the registry before every collection of the metrics registry).
  CoordinatorMetrics& metrics() { return *metrics_; }

  // The stub of the Worker service at `address` (one channel per address).
  std::shared_ptr<v1::Worker::Stub> WorkerStub(const std::string& address);

  // A worker's heartbeat (WorkerRegistry::Heartbeat), with the prompt
  // tokens and sequences it counts beyond this coordinator's own noted
  // (WorkerLoad::unowned_prefill_tokens, unowned_sequences).
  absl::Status Heartbeat(const WorkerRef& worker, WorkerLoad load,
                         const std::vector<std::string>& leased);

  // The registry's workers, with the load the coordinator itself knows of
  // (RequestStateMachine::Loads) in place of the heartbeat's: prompt tokens
  // sent and not yet prefilled (plus the heartbeat's unowned ones), and on
  // workers that decode the blocks of every live reservation and the
  // requests decoding there (plus the unowned ones). Heartbeats lag by up to an
  // interval: a burst of requests would otherwise all pick one worker, and
  // a worker whose prompts were prefilled since its last heartbeat would
  // look busy with them.
  Candidates RoutingCandidates() const;

  // Picks a prefill worker among those of `role` and starts the prefill of
  // attempt `attempt_id` on it in the state machine (StartPrefill, split for
  // role kPrefill), atomically with respect to other picks, so a burst of
  // requests spreads over the pool. The state machine's error if it refuses
  // the edge.
  absl::StatusOr<WorkerInfo> ClaimPrefill(WorkerRole role,
                                          const RequestInfo& request,
                                          const std::string& attempt_id);
  // Picks a decode worker and reserves the request's blocks on it in the
  // state machine (ReserveDecode), atomically with respect to other picks.
  // With `wait`, the one to wait at for room (PickDecodeQueue) instead of
  // one with room (the policy's PickDecode), unless a reservation granted
  // there within the room known here has not been answered yet
  // (RequestLoad::grants_in_flight): then UNAVAILABLE with
  // kGrantsInFlightPayload, reserving nothing (claim again shortly), so a
  // request sent to wait never reaches a worker before an earlier grant and
  // takes its room.
  // With `local` (not waiting): when the picked worker holds all but
  // options().local_prefill_tokens of the prompt (PrefillLocally) and is
  // not in local->not_on, starts the attempt colocated there instead
  // (StartPrefill, its blocks counted as the reservation's would be) and
  // sets local->chosen.
  absl::StatusOr<WorkerInfo> ClaimDecode(const RequestInfo& request,
                                         const std::string& attempt_id,
                                         bool wait = false,
                                         LocalPrefill* local = nullptr);

  // Sends Worker.Cancel for every action of `transition`, in order, without
  // waiting (a failure is logged; the worker also frees orphans it reports
  // in its next heartbeat), and logs and counts a new attempt (a migration
  // in baton_migrations_total). Every transition goes through here once.
  void PerformCleanup(const Transition& transition);

  // Admission (admission.h) of a request about to start: on OK it counts
  // as waiting until EndWaiting. The check and the count are atomic with
  // respect to other admissions and routing picks.
  AdmissionVerdict Admit(const RequestInfo& request);
  // An admitted request reached its first token or ended; once per
  // admitted request.
  void EndWaiting();
  // An admitted request ended (its call is gone); once per admitted request.
  void EndRunning();
  // Admitted requests that have not reached their first token.
  int64_t waiting_requests() const;

  // Registers a running call (request ids are unique while registered).
  void AddCall(const std::string& request_id, std::shared_ptr<CallHandle> call);
  // Unregisters it; the call has finished with its client.
  void RemoveCall(const std::string& request_id);
  int active_calls() const;
  // Calls a new request may start with; false once shutting down.
  bool accepting() const;

  // One sweep now (tests; the sweeper thread calls it periodically).
  void Sweep();

 private:
  // Sets request->cached_tokens for the pool's workers from the prefix
  // index and request->prompt_ids.
  void FillCachedTokens(const Candidates& pool, RequestInfo* request) const;
  Cluster(const ClusterOptions& options, std::unique_ptr<ServedModel> model,
          const Clock* clock, std::unique_ptr<WorkerRegistry> registry,
          std::unique_ptr<RoutingPolicy> policy);
  // Performs the cleanup of sweeper-made transitions and aborts the calls.
  void Apply(const std::vector<Transition>& transitions);

  const ClusterOptions options_;
  const Clock* const clock_;
  const std::unique_ptr<ServedModel> model_;
  const std::unique_ptr<WorkerRegistry> registry_;
  PrefixIndex prefix_index_;
  const std::unique_ptr<RoutingPolicy> policy_;
  RequestStateMachine requests_;
  const std::unique_ptr<CoordinatorMetrics> metrics_;
  std::unique_ptr<metrics::ScrapeHook> scrape_hook_;  // reads registry_

  // Held across a pick and its bookkeeping; taken before mu_.
  mutable absl::Mutex claim_mu_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<v1::Worker::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<CallHandle>> calls_
      ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  int64_t waiting_ ABSL_GUARDED_BY(claim_mu_) = 0;
  int64_t running_ ABSL_GUARDED_BY(claim_mu_) = 0;

  absl::Notification stop_;
  std::thread sweeper_;
  // Reset in the destructor once the calls have ended (Shutdown).
  std::unique_ptr<async::Executor> executor_;
};

}  // namespace baton::coordinator

#endif  // BATON_COORDINATOR_SERVICE_CLUSTER_H_
