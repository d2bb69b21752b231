#include "coordinator/routing_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace baton::coordinator {
namespace {

bool IsExcluded(const RequestInfo& request, const WorkerId& id) {
  return std::find(request.excluded.begin(), request.excluded.end(), id) !=
         request.excluded.end();
}

absl::Status ValidateRequest(const RequestInfo& request) {
  if (request.prompt_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "routing: prompt_tokens must be >= 1, got ", request.prompt_tokens));
  }
  if (request.max_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "routing: max_tokens must be >= 0, got ", request.max_tokens));
  }
  return absl::OkStatus();
}

// Workers of the right model and role that are HEALTHY and not excluded, in
// id order; UNAVAILABLE naming the pool (and why its members were skipped)
// when there is none.
absl::StatusOr<std::vector<const WorkerInfo*>> Eligible(
    const Candidates& candidates, const RequestInfo& request, bool decode) {
  if (absl::Status s = ValidateRequest(request); !s.ok()) return s;
  std::vector<const WorkerInfo*> out;
  int skipped_health = 0;
  int skipped_excluded = 0;
  for (const WorkerInfo& w : candidates) {
    const WorkerRole role = w.registration.role;
    if (decode ? !CanDecode(role) : !CanPrefill(role)) continue;
    if (w.registration.model_id != request.model_id) continue;
    if (w.health != WorkerHealth::kHealthy) {
      ++skipped_health;
      continue;
    }
    if (IsExcluded(request, w.ref.id)) {
      ++skipped_excluded;
      continue;
    }
    out.push_back(&w);
  }
  if (out.empty()) {
    return absl::UnavailableError(absl::StrFormat(
        "no healthy %s worker (role %s or both) for model '%s' (%d not "
        "healthy, %d already tried)",
        decode ? "decode" : "prefill", decode ? "decode" : "prefill",
        request.model_id, skipped_health, skipped_excluded));
  }
  std::sort(out.begin(), out.end(),
            [](const WorkerInfo* a, const WorkerInfo* b) {
              return a->ref.id < b->ref.id;
            });
  return out;
}

class LeastLoadedPolicy final : public RoutingPolicy {
 public:
  explicit LeastLoadedPolicy(double prefix_weight)
      : prefix_weight_(prefix_weight) {}
  absl::string_view name() const override { return "least_loaded"; }

  absl::StatusOr<WorkerRef> PickPrefill(const Candidates& candidates,
                                        const RequestInfo& request) override {
    absl::StatusOr<std::vector<const WorkerInfo*>> eligible =
        EligiblePrefill(candidates, request);
    if (!eligible.ok()) return eligible.status();
    auto cost = [&](const WorkerInfo* w) {
      auto it = request.cached_tokens.find(w->ref.id);
      const int64_t cached = it == request.cached_tokens.end() ? 0 : it->second;
      return static_cast<double>(w->load.queued_prefill_tokens) +
             static_cast<double>(request.prompt_tokens) -
             prefix_weight_ * static_cast<double>(cached);
    };
    // Equal costs (most often: no prompt queued anywhere) go to the worker
    // running the fewest sequences: on colocated workers a prompt's prefill
    // holds up every sequence decoding beside it. Eligible is in id order,
    // so the first minimum wins the remaining ties.
    const WorkerInfo* best = *std::min_element(
        eligible->begin(), eligible->end(),
        [&](const WorkerInfo* a, const WorkerInfo* b) {
          const double ca = cost(a), cb = cost(b);
          if (ca != cb) return ca < cb;
          return a->load.running_sequences < b->load.running_sequences;
        });
    return best->ref;
  }

  absl::StatusOr<WorkerRef> PickDecode(const Candidates& candidates,
                                       const RequestInfo& request) override {
    absl::StatusOr<std::vector<const WorkerInfo*>> eligible =
        EligibleDecode(candidates, request);
    if (!eligible.ok()) return eligible.status();
    // Room to spare, plus what the worker would not need to receive: the
    // blocks of the prompt its prefix cache holds (a conversation's next
    // turn goes back to the worker that decoded the last one).
    auto score = [&](const WorkerInfo* w) {
      auto it = request.cached_tokens.find(w->ref.id);
      const int64_t block_size =
          std::max<int64_t>(1, w->registration.kv_layout.block_size);
      const int64_t cached_blocks =
          it == request.cached_tokens.end() ? 0 : it->second / block_size;
      return static_cast<double>(w->load.kv_blocks_free) +
             prefix_weight_ * static_cast<double>(cached_blocks);
    };
    // Eligible is in id order, so the first maximum wins ties.
    const WorkerInfo* best =
        *std::min_element(eligible->begin(), eligible->end(),
                          [&](const WorkerInfo* a, const WorkerInfo* b) {
                            return score(a) > score(b);
                          });
    return best->ref;
  }

 private:
  const double prefix_weight_;
};

class RoundRobinPolicy final : public RoutingPolicy {
 public:
  absl::string_view name() const override { return "round_robin"; }

  absl::StatusOr<WorkerRef> PickPrefill(const Candidates& candidates,
                                        const RequestInfo& request) override {
    absl::StatusOr<std::vector<const WorkerInfo*>> eligible =
        EligiblePrefill(candidates, request);
    if (!eligible.ok()) return eligible.status();
    absl::MutexLock lock(&mu_);
    return (*eligible)[next_prefill_++ % eligible->size()]->ref;
  }

  absl::StatusOr<WorkerRef> PickDecode(const Candidates& candidates,
                                       const RequestInfo& request) override {
    absl::StatusOr<std::vector<const WorkerInfo*>> eligible =
        EligibleDecode(candidates, request);
    if (!eligible.ok()) return eligible.status();
    absl::MutexLock lock(&mu_);
    return (*eligible)[next_decode_++ % eligible->size()]->ref;
  }

 private:
  absl::Mutex mu_;
  uint64_t next_prefill_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_decode_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

std::unique_ptr<RoutingPolicy> NewLeastLoadedPolicy(double prefix_weight) {
  return std::make_unique<LeastLoadedPolicy>(prefix_weight);
}

std::unique_ptr<RoutingPolicy> NewRoundRobinPolicy() {
  return std::make_unique<RoundRobinPolicy>();
}

int64_t DecodeBlocksNeeded(const RequestInfo& request, int64_t block_size) {
  if (block_size <= 0) return INT64_MAX;
  const int64_t tokens = request.prompt_tokens + request.max_tokens;
  return (tokens + block_size - 1) / block_size;
}

DecodeCapacity LargestDecodePool(const Candidates& candidates,
                                 absl::string_view model_id) {
  DecodeCapacity largest;
  for (const WorkerInfo& w : candidates) {
    if (!CanDecode(w.registration.role) || w.health != WorkerHealth::kHealthy ||
        w.registration.model_id != model_id) {
      continue;
    }
    if (w.registration.kv_blocks_total > largest.blocks) {
      largest.blocks = w.registration.kv_blocks_total;
      largest.block_size = w.registration.kv_layout.block_size;
    }
  }
  return largest;
}

absl::StatusOr<WorkerRef> PickDecodeQueue(const Candidates& candidates,
                                          const RequestInfo& request) {
  absl::StatusOr<std::vector<const WorkerInfo*>> eligible =
      Eligible(candidates, request, /*decode=*/true);
  if (!eligible.ok()) return eligible.status();
  const WorkerInfo* best = nullptr;
  int64_t largest = 0;
  for (const WorkerInfo* w : *eligible) {
    largest = std::max(largest, w->registration.kv_blocks_total);
    if (DecodeBlocksNeeded(request, w->registration.kv_layout.block_size) >
        w->registration.kv_blocks_total) {
      continue;
    }
    if (best == nullptr ||
        w->load.queued_reservations < best->load.queued_reservations ||
        (w->load.queued_reservations == best->load.queued_reservations &&
         w->load.kv_blocks_free > best->load.kv_blocks_free)) {
      best = w;
    }
  }
  if (best == nullptr) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "no decode worker for model '%s' is big enough for prompt %d + "
        "max_tokens %d tokens (the largest has %d KV blocks)",
        request.model_id, request.prompt_tokens, request.max_tokens, largest));
  }
  return best->ref;
}

bool PrefillLocally(const RequestInfo& request, const WorkerId& decode_worker,
                    int64_t max_uncached) {
  if (max_uncached <= 0) return false;
  const auto found = request.cached_tokens.find(decode_worker);
  return found != request.cached_tokens.end() && found->second > 0 &&
         request.prompt_tokens - found->second <= max_uncached;
}

WorkerRole PrefillRole(const Candidates& candidates,
                       absl::string_view model_id) {
  const bool split = std::any_of(
      candidates.begin(), candidates.end(), [&](const WorkerInfo& w) {
        return w.registration.role == WorkerRole::kPrefill &&
               (w.health == WorkerHealth::kHealthy ||
                w.health == WorkerHealth::kSuspect) &&
               w.registration.model_id == model_id;
      });
  return split ? WorkerRole::kPrefill : WorkerRole::kBoth;
}

bool AnySuspect(const Candidates& candidates, const RequestInfo& request,
                bool (*in_pool)(WorkerRole)) {
  return std::any_of(candidates.begin(), candidates.end(),
                     [&](const WorkerInfo& w) {
                       return w.health == WorkerHealth::kSuspect &&
                              in_pool(w.registration.role) &&
                              w.registration.model_id == request.model_id &&
                              !IsExcluded(request, w.ref.id);
                     });
}

absl::StatusOr<std::vector<const WorkerInfo*>> EligiblePrefill(
    const Candidates& candidates, const RequestInfo& request) {
  return Eligible(candidates, request, /*decode=*/false);
}

absl::StatusOr<std::vector<const WorkerInfo*>> EligibleDecode(
    const Candidates& candidates, const RequestInfo& request) {
  absl::StatusOr<std::vector<const WorkerInfo*>> eligible =
      Eligible(candidates, request, /*decode=*/true);
  if (!eligible.ok()) return eligible;
  std::vector<const WorkerInfo*> with_room;
  const WorkerInfo* most_free = nullptr;
  for (const WorkerInfo* w : *eligible) {
    const int64_t needed =
        DecodeBlocksNeeded(request, w->registration.kv_layout.block_size);
    if (w->load.kv_blocks_free >= needed) with_room.push_back(w);
    if (most_free == nullptr ||
        w->load.kv_blocks_free > most_free->load.kv_blocks_free) {
      most_free = w;
    }
  }
  if (with_room.empty()) {
    const int64_t block_size = most_free->registration.kv_layout.block_size;
    return absl::ResourceExhaustedError(absl::StrFormat(
        "no decode worker for model '%s' has room: need %d KV blocks (prompt "
        "%d + max_tokens %d tokens, block size %d); most free is %s with %d "
        "of %d",
        request.model_id, DecodeBlocksNeeded(request, block_size),
        request.prompt_tokens, request.max_tokens, block_size,
        most_free->ref.id, most_free->load.kv_blocks_free,
        most_free->load.kv_blocks_total));
  }
  return with_room;
}

}  // namespace baton::coordinator
