// The coordinator's table of workers: registration, heartbeats with load, and
// liveness by lease. A worker is HEALTHY while heartbeats arrive, SUSPECT once
// `suspect_after` passes without one (no new requests are routed to it), and
// DOWN once `lease_ttl` passes (every request it took part in must fail and
// every lease it held is released) with no sign of life at all: a worker
// whose streams still deliver data (RecordActivity) stays SUSPECT through a
// missed heartbeat window rather than failing those streams. A worker that
// registers again from the same address keeps its id and gets a new epoch; its
// previous incarnation is reported DOWN.
//
// A wedged engine: a worker whose heartbeats report running sequences or
// queued prompt tokens while its engine step count (WorkerLoad::engine_steps)
// stands still for `engine_stall_after` goes DOWN, so its requests fail or
// migrate like a dead worker's. The process still answers, so it registers
// again; that incarnation stays SUSPECT (no new requests) until its count
// moves or its work is gone.
//
// DOWN transitions are queued and handed out by Tick(), so the caller feeds
// each exactly once to RequestStateMachine::OnWorkerDown.
#ifndef BATON_COORDINATOR_WORKER_REGISTRY_H_
#define BATON_COORDINATOR_WORKER_REGISTRY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/clock.h"
#include "coordinator/types.h"
#include "worker/kv_cache/kv_layout.h"
#include "worker/kv_cache/prefix_hash.h"

namespace baton::coordinator {

// The most a worker may report of a count (blocks, queued tokens): far
// beyond any real worker, and far enough from int64's end that routing's
// sums cannot overflow.
inline constexpr int64_t kMaxLoadCount = int64_t{1} << 40;

struct WorkerRegistryOptions {
  // Workers are told to heartbeat at least this often.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Without a heartbeat for longer than this a worker is SUSPECT.
  absl::Duration suspect_after = absl::Seconds(2);
  // Without a heartbeat for longer than this a worker is DOWN.
  // Requires 0 < heartbeat_interval <= suspect_after < lease_ttl.
  absl::Duration lease_ttl = absl::Seconds(5);
  // When every live worker (two or more) is silent past lease_ttl at once,
  // the coordinator itself, its host or its network stalled far more likely
  // than every worker died: they stay SUSPECT (no new requests) and go DOWN
  // only after this long without a sign, as Kubernetes' node lifecycle
  // controller stops evicting in a full disruption. A dead worker's streams
  // still fail on the transport at once. Zero: 3 * lease_ttl; else
  // >= lease_ttl.
  absl::Duration disruption_ttl = absl::ZeroDuration();
  // The first registration's epoch; each later one gets the next. The
  // coordinator starts it at the microseconds since the Unix epoch, so a
  // restarted coordinator never hands out an epoch seen before. >= 1.
  uint64_t first_epoch = 1;
  // A worker with work whose engine made no step for longer than this is
  // wedged (see above). > 0; InfiniteDuration() turns the check off.
  absl::Duration engine_stall_after = absl::Seconds(60);
};

// What a worker announces (RegisterWorkerRequest).
struct WorkerRegistration {
  WorkerRole role = WorkerRole::kBoth;
  // The worker's own stable name (1-64 of [A-Za-z0-9._-]); empty: the
  // registry names it "wN", one name per address.
  std::string worker_id;
  // Random per worker process; with worker_id, another incarnation under
  // the same name is the worker restarted. Must be != 0 with worker_id.
  uint64_t incarnation = 0;
  // host:port of its Worker service.
  std::string address;
  std::string model_id;
  KvLayout kv_layout;
  int64_t kv_blocks_total = 0;
  int32_t context_length = 0;
  // Where its prefix chains start (prefix_hash.h); unset: no prefix cache.
  std::optional<BlockHash> prefix_root;
  // The device holding its KV pool ("HOST/GPU-UUID"); empty: host memory,
  // so its KV moves over HOST_TCP only.
  std::string kv_device;
};

// The registry's view of one worker (current incarnation).
// (WorkerRegistry::ListWithoutLeases copies each field but
// leased_request_ids by name: a new field goes there too.)
struct WorkerInfo {
  WorkerRef ref;
  WorkerRegistration registration;
  WorkerHealth health = WorkerHealth::kHealthy;
  // Registration fills kv_blocks_free = kv_blocks_total; heartbeats replace.
  WorkerLoad load;
  absl::Time last_heartbeat;
  // The last data this coordinator's streams received from it
  // (RecordActivity); InfinitePast if none.
  absl::Time last_activity = absl::InfinitePast();
  // As last reported by the worker.
  std::vector<std::string> leased_request_ids;
  // The last heartbeat whose engine_steps moved, or that reported no work.
  absl::Time last_progress;
  // Went DOWN (or registered again) with a wedged engine; stays SUSPECT
  // until engine_steps moves or the work is gone.
  bool engine_stalled = false;
};

// An incarnation that went DOWN: lease expired, replaced by a re-registration,
// or removed.
struct DownEvent {
  WorkerRef worker;
  // "lease expired (no heartbeat for 5s)", "re-registered as epoch 9", ...
  std::string reason;
  // The worker's last reported leases (for logs; the state machine is
  // authoritative about which requests the worker took part in).
  std::vector<std::string> last_leased_request_ids;
};

// Thread-safe.
class WorkerRegistry {
 public:
  // InvalidArgument if the durations are not ordered as documented.
  // `clock` must outlive the registry.
  static absl::StatusOr<std::unique_ptr<WorkerRegistry>> Create(
      const WorkerRegistryOptions& options, const Clock* clock);

  WorkerRegistry(const WorkerRegistry&) = delete;
  WorkerRegistry& operator=(const WorkerRegistry&) = delete;

  const WorkerRegistryOptions& options() const { return options_; }

  // Adds a worker, or a new incarnation of a known one (same id, new epoch;
  // the old incarnation is queued as DOWN unless it already was). The id is
  // registration.worker_id when set, else the one given to its address
  // before (or a new "wN"). A live worker at the same address under another
  // id is replaced too (queued DOWN). InvalidArgument naming the field for
  // an empty address or model id, a malformed worker_id, incarnation 0 with
  // a worker_id, a bad layout, or kv_blocks_total < 0 (or 0 for a role that
  // decodes); AlreadyExists if worker_id names a live worker at another
  // address with another incarnation.
  absl::StatusOr<WorkerRef> Register(const WorkerRegistration& registration);

  // Renews the lease and records load and leases. NotFound for an unknown id;
  // FailedPrecondition for a stale epoch or a worker already DOWN (it must
  // drop its leases and register again); InvalidArgument for inconsistent
  // load (negative counts, free + reserved > total, total differing from the
  // registration).
  absl::Status Heartbeat(const WorkerRef& worker, const WorkerLoad& load,
                         std::vector<std::string> leased_request_ids);

  // A stream of this coordinator received data from the worker now: a sign
  // of life that keeps it from going DOWN (not from SUSPECT) while its
  // heartbeats are late. Ignored for an unknown, stale or DOWN worker.
  void RecordActivity(const WorkerRef& worker);

  // The worker stops taking new requests (DRAINING); it still heartbeats and
  // still goes DOWN if its lease expires. NotFound / FailedPrecondition as
  // Heartbeat.
  absl::Status Drain(const WorkerRef& worker);

  // Marks the incarnation DOWN now (e.g. drained and finished) and queues its
  // DownEvent. NotFound / FailedPrecondition as Heartbeat.
  absl::Status Remove(const WorkerRef& worker, absl::string_view reason);

  // Re-evaluates every lease against the clock, then returns (and forgets)
  // every queued DownEvent, ordered by worker id then epoch.
  std::vector<DownEvent> Tick();

  // Every worker's current incarnation (DOWN ones included), by id. Health
  // is as of the last Tick / Heartbeat.
  std::vector<WorkerInfo> List() const;
  // As List, without each worker's leased_request_ids (empty): what routing
  // reads for every request, so it copies no string per request held.
  std::vector<WorkerInfo> ListWithoutLeases() const;
  // NotFound for an unknown id.
  absl::StatusOr<WorkerInfo> Get(absl::string_view id) const;

 private:
  WorkerRegistry(const WorkerRegistryOptions& options, const Clock* clock)
      : options_(options), clock_(clock), next_epoch_(options.first_epoch) {}
  // The id a registration gets (see Register); marks what it replaces DOWN.
  absl::StatusOr<WorkerId> ClaimIdLocked(const WorkerRegistration& r,
                                         uint64_t epoch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // NotFound / FailedPrecondition for an unusable (worker, epoch).
  absl::StatusOr<WorkerInfo*> FindLiveLocked(const WorkerRef& worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `ttl`: the lease in force now (LeaseLocked).
  void UpdateHealthLocked(WorkerInfo& info, absl::Time now, absl::Duration ttl)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // lease_ttl, or the disruption TTL while every live worker (two or more)
  // has been silent past lease_ttl.
  // Records the time in disrupted_at_ when it finds a disruption.
  absl::Duration LeaseLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkDownLocked(WorkerInfo& info, std::string reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const WorkerRegistryOptions options_;
  const Clock* const clock_;

  mutable absl::Mutex mu_;
  std::map<WorkerId, WorkerInfo, std::less<>> workers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, WorkerId> id_by_address_ ABSL_GUARDED_BY(mu_);
  std::vector<DownEvent> pending_down_ ABSL_GUARDED_BY(mu_);
  // The last time every live worker was silent at once (LeaseLocked).
  absl::Time disrupted_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t next_worker_number_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_epoch_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::coordinator

#endif  // BATON_COORDINATOR_WORKER_REGISTRY_H_
