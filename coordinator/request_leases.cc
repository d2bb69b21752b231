#include "coordinator/request_leases.h"

namespace baton::coordinator::internal {

bool Matches(const WorkerRef& holder, const WorkerRef& down) {
  return holder.id == down.id && holder.epoch <= down.epoch;
}

std::vector<Held> HeldLeases(RequestState state,
                             const std::optional<WorkerRef>& prefill,
                             const std::optional<WorkerRef>& decode,
                             bool colocated) {
  using Kind = CleanupAction::Kind;
  switch (state) {
    case RequestState::kQueued:
      if (decode.has_value()) return {Held{*decode, Kind::kFreeKv}};
      return {};
    case RequestState::kPrefilling:
      if (colocated) return {Held{*prefill, Kind::kCancelOnWorker}};
      return {Held{*prefill, Kind::kCancelOnWorker},
              Held{*decode, Kind::kFreeKv}};
    case RequestState::kTransferring:
      return {Held{*prefill, Kind::kCancelOnWorker},
              Held{*decode, Kind::kFreeKv}};
    case RequestState::kDecoding:
      return {Held{*decode, Kind::kCancelOnWorker}};
    default:
      return {};
  }
}

}  // namespace baton::coordinator::internal
