// Which worker runs a request's prefill and which its decode. A policy sees a
// snapshot of the registry and picks among the eligible workers:
//   - health HEALTHY (SUSPECT, DRAINING and DOWN workers take no new work),
//   - serving the request's model,
//   - a role that can do the phase (`both` workers are eligible for either),
//   - not in the request's excluded list (decode workers already tried);
// and for decode, free KV blocks that hold prompt + max_tokens.
// UNAVAILABLE names the empty pool when no eligible worker exists;
// RESOURCE_EXHAUSTED gives the numbers when none has room.
#ifndef BATON_COORDINATOR_ROUTING_POLICY_H_
#define BATON_COORDINATOR_ROUTING_POLICY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/types.h"
#include "coordinator/worker_registry.h"

namespace baton::coordinator {

// A registry snapshot (WorkerRegistry::List()).
using Candidates = std::vector<WorkerInfo>;

// What a policy needs to know about a request.
struct RequestInfo {
  std::string model_id;
  // Tokens of the rendered prompt; >= 1.
  int64_t prompt_tokens = 0;
  // Tokens the request may generate; >= 0.
  int64_t max_tokens = 0;
  // Workers not to pick (e.g. decode workers that refused a reservation).
  std::vector<WorkerId> excluded;
  // The rendered prompt's token ids (prompt_tokens of them), when known;
  // must outlive the routing call. Cluster fills cached_tokens from it.
  const std::vector<int32_t>* prompt_ids = nullptr;
  // Prompt tokens each worker's prefix cache is known to hold (the
  // coordinator's PrefixIndex); absent: none.
  absl::flat_hash_map<WorkerId, int64_t> cached_tokens;
};

// KV blocks a decode worker with `block_size` tokens per block needs for the
// request: ceil((prompt_tokens + max_tokens) / block_size).
int64_t DecodeBlocksNeeded(const RequestInfo& request, int64_t block_size);

// The largest KV pool (kv_blocks_total) among healthy workers that decode
// `model_id`, with its block size; zeros when none is up. A request whose
// prompt + max_tokens needs more blocks cannot be served until a larger
// decode worker joins.
struct DecodeCapacity {
  int64_t blocks = 0;
  int64_t block_size = 0;
  // Tokens (prompt + max_tokens) one request may hold there.
  int64_t tokens() const { return blocks * block_size; }
};
DecodeCapacity LargestDecodePool(const Candidates& candidates,
                                 absl::string_view model_id);

// Thread-safe implementations only.
class RoutingPolicy {
 public:
  virtual ~RoutingPolicy() = default;
  virtual absl::string_view name() const = 0;
  virtual absl::StatusOr<WorkerRef> PickPrefill(const Candidates& candidates,
                                                const RequestInfo& request) = 0;
  virtual absl::StatusOr<WorkerRef> PickDecode(const Candidates& candidates,
                                               const RequestInfo& request) = 0;
};

// Prefill: the least work before this request's first token, counted in
// prompt tokens to compute: queued_prefill_tokens + prompt_tokens -
// prefix_weight * cached_tokens (with the default weight 1, a token already
// cached counts exactly as a token of queue saved; 0 ignores the cache;
// above 1 favours cache hits over balance). Decode: among the workers with
// room, the most kv_blocks_free + prefix_weight * the blocks of the prompt
// the worker holds (those it need not receive), so a conversation's next
// turn returns to the decode worker that holds it unless another has that
// much more room. Prefill ties go to the worker running the fewest
// sequences (on a colocated worker a prefill stalls every decode beside
// it); remaining ties to the smallest worker id (string order).
std::unique_ptr<RoutingPolicy> NewLeastLoadedPolicy(double prefix_weight = 1.0);

// Cycles through the eligible workers in id order, one counter per phase;
// decode still skips workers without room. For tests and comparison.
std::unique_ptr<RoutingPolicy> NewRoundRobinPolicy();

// Where a request waits for decode room when no decode worker has it: the
// healthy decode worker big enough for it (kv_blocks_total) with the fewest
// reservations waiting there, then the most free blocks, then the smallest
// id. UNAVAILABLE when none is healthy, FAILED_PRECONDITION when none is
// big enough.
absl::StatusOr<WorkerRef> PickDecodeQueue(const Candidates& candidates,
                                          const RequestInfo& request);

// Split serving's shortcut, once the policy picked `decode_worker` for the
// request: whether that worker's prefix cache holds part of the prompt
// (request.cached_tokens) and all but at most `max_uncached` of its tokens,
// so it is served colocated there, the worker prefilling the rest itself
// (ClusterOptions::local_prefill_tokens; 0: never).
bool PrefillLocally(const RequestInfo& request, const WorkerId& decode_worker,
                    int64_t max_uncached);

// Which workers prefill a request for `model_id`: prefill-role ones when a
// healthy or suspect one serves the model (split serving: the KV then goes
// to a decode worker), else `both` workers (colocated serving). A prefill
// pool whose heartbeats are late does not switch the cluster to colocated
// serving for a moment.
WorkerRole PrefillRole(const Candidates& candidates,
                       absl::string_view model_id);

// Whether a worker of the request's model, of a role `in_pool` admits and
// not excluded by the request, is SUSPECT (heartbeats late, not DOWN): when
// such a pool has no healthy worker, a request waits for one to be heard
// from again (up to its queue timeout) rather than failing at once.
bool AnySuspect(const Candidates& candidates, const RequestInfo& request,
                bool (*in_pool)(WorkerRole));

// The eligible workers for a phase, in id order, or the UNAVAILABLE /
// RESOURCE_EXHAUSTED status described above. Shared by the policies.
absl::StatusOr<std::vector<const WorkerInfo*>> EligiblePrefill(
    const Candidates& candidates, const RequestInfo& request);
absl::StatusOr<std::vector<const WorkerInfo*>> EligibleDecode(
    const Candidates& candidates, const RequestInfo& request);

}  // namespace baton::coordinator

#endif  // BATON_COORDINATOR_ROUTING_POLICY_H_
