// Which workers hold KV leases for a request in each state (the table in
// request_state_machine.h), shared by the state machine's edges and sweeps.
#ifndef BATON_COORDINATOR_REQUEST_LEASES_H_
#define BATON_COORDINATOR_REQUEST_LEASES_H_

#include <optional>
#include <vector>

#include "coordinator/request_state_machine.h"
#include "coordinator/types.h"

namespace baton::coordinator::internal {

// A live lease of a request and the action that ends it.
struct Held {
  WorkerRef worker;
  CleanupAction::Kind kind;
};

// Whether a lease held by `holder` dies with the incarnation `down`.
bool Matches(const WorkerRef& holder, const WorkerRef& down);

// The leases a record in `state` holds, prefill side first.
std::vector<Held> HeldLeases(RequestState state,
                             const std::optional<WorkerRef>& prefill,
                             const std::optional<WorkerRef>& decode,
                             bool colocated);

}  // namespace baton::coordinator::internal

#endif  // BATON_COORDINATOR_REQUEST_LEASES_H_
