#include "coordinator/worker_registry.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace baton::coordinator {

namespace {

// What the engine should be stepping through: a step count that stands
// still with this is a wedge, without it an idle engine.
bool HasEngineWork(const WorkerLoad& load) {
  return load.running_sequences > 0 || load.queued_prefill_tokens > 0;
}

// HOST:PORT as a worker's gRPC server is dialed (HOST may be an IPv6
// address in brackets).
bool IsHostPort(absl::string_view address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  return address.size() <= 255 && colon != absl::string_view::npos &&
         colon > 0 && absl::SimpleAtoi(address.substr(colon + 1), &port) &&
         port >= 1 && port <= 65535 &&
         std::all_of(address.begin(), address.end(), [](char c) {
           return absl::ascii_isgraph(static_cast<unsigned char>(c));
         });
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerRegistry>> WorkerRegistry::Create(
    const WorkerRegistryOptions& options, const Clock* clock) {
  if (clock == nullptr) {
    return absl::InvalidArgumentError("WorkerRegistry: clock is null");
  }
  if (!(options.heartbeat_interval > absl::ZeroDuration() &&
        options.heartbeat_interval <= options.suspect_after &&
        options.suspect_after < options.lease_ttl)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WorkerRegistryOptions: need 0 < heartbeat_interval <= suspect_after "
        "< lease_ttl, got heartbeat_interval=",
        absl::FormatDuration(options.heartbeat_interval),
        " suspect_after=", absl::FormatDuration(options.suspect_after),
        " lease_ttl=", absl::FormatDuration(options.lease_ttl)));
  }
  if (options.disruption_ttl != absl::ZeroDuration() &&
      options.disruption_ttl < options.lease_ttl) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WorkerRegistryOptions: disruption_ttl must be 0 (3 * lease_ttl) or "
        ">= lease_ttl, got ",
        absl::FormatDuration(options.disruption_ttl)));
  }
  if (options.engine_stall_after <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("WorkerRegistryOptions: engine_stall_after must be > 0, "
                     "got ",
                     absl::FormatDuration(options.engine_stall_after)));
  }
  return std::unique_ptr<WorkerRegistry>(new WorkerRegistry(options, clock));
}

absl::StatusOr<WorkerRef> WorkerRegistry::Register(
    const WorkerRegistration& registration) {
  if (registration.address.empty()) {
    return absl::InvalidArgumentError("RegisterWorker: address is empty");
  }
  if (!IsHostPort(registration.address)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RegisterWorker: address '",
        absl::CHexEscape(registration.address.substr(0, 80)),
        "' must be HOST:PORT (at most 255 printable bytes without spaces, "
        "PORT in [1, 65535])"));
  }
  if (registration.model_id.empty()) {
    return absl::InvalidArgumentError("RegisterWorker: model_id is empty");
  }
  BATON_RETURN_IF_ERROR(registration.kv_layout.Validate());
  const int64_t min_blocks = CanDecode(registration.role) ? 1 : 0;
  if (registration.kv_blocks_total < min_blocks ||
      registration.kv_blocks_total > kMaxLoadCount) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "RegisterWorker: kv_blocks_total %d must be in [%d, %d] for role %s",
        registration.kv_blocks_total, min_blocks, kMaxLoadCount,
        WorkerRoleName(registration.role)));
  }

  if (!registration.worker_id.empty()) {
    const std::string& name = registration.worker_id;
    const bool well_formed =
        name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
          return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
                 c == '.' || c == '_' || c == '-';
        });
    if (!well_formed) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RegisterWorker: worker_id '", absl::CHexEscape(name.substr(0, 80)),
          "' must be 1-64 characters of [A-Za-z0-9._-]"));
    }
    if (registration.incarnation == 0) {
      return absl::InvalidArgumentError(
          "RegisterWorker: incarnation must be != 0 with a worker_id");
    }
  }

  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  const uint64_t epoch = next_epoch_;
  BATON_ASSIGN_OR_RETURN(const WorkerId id, ClaimIdLocked(registration, epoch));
  ++next_epoch_;
  WorkerInfo info;
  info.ref = WorkerRef{id, epoch};
  info.registration = registration;
  info.health = WorkerHealth::kHealthy;
  info.load.kv_blocks_total = registration.kv_blocks_total;
  info.load.kv_blocks_free = registration.kv_blocks_total;
  info.last_heartbeat = now;
  info.last_progress = now;
  // The same process back after its wedged engine took it DOWN: still
  // wedged until its step count moves.
  if (auto previous = workers_.find(id);
      previous != workers_.end() && previous->second.engine_stalled &&
      previous->second.registration.incarnation == registration.incarnation) {
    info.engine_stalled = true;
    info.health = WorkerHealth::kSuspect;
    info.load.engine_steps = previous->second.load.engine_steps;
    info.last_progress = previous->second.last_progress;
  }
  workers_.insert_or_assign(id, std::move(info));
  return WorkerRef{id, epoch};
}

absl::StatusOr<WorkerId> WorkerRegistry::ClaimIdLocked(
    const WorkerRegistration& r, uint64_t epoch) {
  WorkerId id = r.worker_id;
  if (id.empty()) {
    auto by_address = id_by_address_.find(r.address);
    if (by_address != id_by_address_.end()) {
      id = by_address->second;
    } else {
      id = absl::StrCat("w", next_worker_number_++);
      id_by_address_.emplace(r.address, id);
    }
  } else if (auto it = workers_.find(id);
             it != workers_.end() && it->second.health != WorkerHealth::kDown &&
             it->second.registration.address != r.address &&
             it->second.registration.incarnation != r.incarnation) {
    const absl::Time now = clock_->Now();
    UpdateHealthLocked(it->second, now, LeaseLocked(now));
    if (it->second.health != WorkerHealth::kDown) {
      return absl::AlreadyExistsError(absl::StrCat(
          "RegisterWorker: worker_id '", id, "' is held by a live worker at ",
          it->second.registration.address,
          " (another incarnation); choose "
          "another --worker_id or stop that worker"));
    }
  }
  // What this registration replaces: the id's previous incarnation, and a
  // live worker under another id at the same address (it is gone: the
  // address is someone else's now).
  for (auto& [other_id, info] : workers_) {
    if (info.health == WorkerHealth::kDown) continue;
    if (other_id == id) {
      MarkDownLocked(
          info,
          info.registration.incarnation != r.incarnation
              ? absl::StrCat("restarted (incarnation ",
                             absl::Hex(r.incarnation), "), now epoch ", epoch)
              : absl::StrCat("re-registered as epoch ", epoch));
    } else if (info.registration.address == r.address) {
      MarkDownLocked(info, absl::StrCat("its address ", r.address,
                                        " now belongs to worker ", id));
    }
  }
  return id;
}

absl::StatusOr<WorkerInfo*> WorkerRegistry::FindLiveLocked(
    const WorkerRef& worker) {
  auto it = workers_.find(worker.id);
  if (it == workers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("worker '", worker.id, "' is not registered"));
  }
  WorkerInfo& info = it->second;
  if (info.ref.epoch != worker.epoch) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker '", worker.id, "': epoch ", worker.epoch, " is stale (current ",
        info.ref.epoch, "); register again"));
  }
  const absl::Time now = clock_->Now();
  UpdateHealthLocked(info, now, LeaseLocked(now));
  if (info.health == WorkerHealth::kDown) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", WorkerRefString(worker),
                     " is down (lease expired or removed); register again"));
  }
  return &info;
}

absl::Status WorkerRegistry::Heartbeat(
    const WorkerRef& worker, const WorkerLoad& load,
    std::vector<std::string> leased_request_ids) {
  if (load.queued_prefill_tokens < 0 || load.running_sequences < 0 ||
      load.kv_blocks_free < 0 || load.kv_blocks_reserved < 0 ||
      load.kv_blocks_total < 0 || load.queued_reservations < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Heartbeat from %s: negative load field (queued_prefill_tokens=%d "
        "running_sequences=%d kv_blocks_free=%d kv_blocks_reserved=%d "
        "kv_blocks_total=%d queued_reservations=%d)",
        WorkerRefString(worker), load.queued_prefill_tokens,
        load.running_sequences, load.kv_blocks_free, load.kv_blocks_reserved,
        load.kv_blocks_total, load.queued_reservations));
  }
  // Routing adds and compares these counts: none may be near int64's end.
  if (load.queued_prefill_tokens > kMaxLoadCount ||
      load.kv_blocks_free > kMaxLoadCount ||
      load.kv_blocks_reserved > kMaxLoadCount ||
      load.kv_blocks_total > kMaxLoadCount || load.engine_steps < 0 ||
      !std::isfinite(load.prefill_tokens_per_second) ||
      load.prefill_tokens_per_second < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Heartbeat from %s: a load field out of range (queued_prefill_tokens, "
        "kv_blocks_free, kv_blocks_reserved and kv_blocks_total must be <= "
        "%d; engine_steps >= 0; prefill_tokens_per_second finite and >= 0): "
        "%d %d %d %d %d %g",
        WorkerRefString(worker), kMaxLoadCount, load.queued_prefill_tokens,
        load.kv_blocks_free, load.kv_blocks_reserved, load.kv_blocks_total,
        load.engine_steps, load.prefill_tokens_per_second));
  }
  if (load.kv_blocks_free + load.kv_blocks_reserved > load.kv_blocks_total) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Heartbeat from %s: kv_blocks_free %d + kv_blocks_reserved %d exceeds "
        "kv_blocks_total %d",
        WorkerRefString(worker), load.kv_blocks_free, load.kv_blocks_reserved,
        load.kv_blocks_total));
  }
  absl::MutexLock lock(&mu_);
  BATON_ASSIGN_OR_RETURN(WorkerInfo * info, FindLiveLocked(worker));
  if (load.kv_blocks_total != info->registration.kv_blocks_total) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Heartbeat from %s: kv_blocks_total %d differs from the registered %d",
        WorkerRefString(worker), load.kv_blocks_total,
        info->registration.kv_blocks_total));
  }
  const absl::Time now = clock_->Now();
  if (!HasEngineWork(load) || load.engine_steps != info->load.engine_steps) {
    info->last_progress = now;
    info->engine_stalled = false;
  }
  info->load = load;
  info->leased_request_ids = std::move(leased_request_ids);
  info->last_heartbeat = now;
  if (info->health == WorkerHealth::kSuspect && !info->engine_stalled) {
    info->health = WorkerHealth::kHealthy;
  }
  return absl::OkStatus();
}

absl::Status WorkerRegistry::Drain(const WorkerRef& worker) {
  absl::MutexLock lock(&mu_);
  BATON_ASSIGN_OR_RETURN(WorkerInfo * info, FindLiveLocked(worker));
  info->health = WorkerHealth::kDraining;
  return absl::OkStatus();
}

absl::Status WorkerRegistry::Remove(const WorkerRef& worker,
                                    absl::string_view reason) {
  absl::MutexLock lock(&mu_);
  BATON_ASSIGN_OR_RETURN(WorkerInfo * info, FindLiveLocked(worker));
  MarkDownLocked(*info, std::string(reason));
  return absl::OkStatus();
}

void WorkerRegistry::RecordActivity(const WorkerRef& worker) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<WorkerInfo*> info = FindLiveLocked(worker);
  if (info.ok()) (*info)->last_activity = clock_->Now();
}

absl::Duration WorkerRegistry::LeaseLocked(absl::Time now) {
  int live = 0;
  for (const auto& [id, info] : workers_) {
    if (info.health == WorkerHealth::kDown) continue;
    if (now - std::max(info.last_heartbeat, info.last_activity) <=
        options_.lease_ttl) {
      return options_.lease_ttl;  // someone is heard from: no disruption
    }
    ++live;
  }
  if (live < 2) return options_.lease_ttl;
  disrupted_at_ = now;
  return options_.disruption_ttl != absl::ZeroDuration()
             ? options_.disruption_ttl
             : 3 * options_.lease_ttl;
}

void WorkerRegistry::UpdateHealthLocked(WorkerInfo& info, absl::Time now,
                                        absl::Duration ttl) {
  if (info.health == WorkerHealth::kDown) return;
  const absl::Duration silent = now - info.last_heartbeat;
  const absl::Duration quiet =
      now - std::max(info.last_heartbeat, info.last_activity);
  // Outside a disruption, the time the coordinator heard from nobody does
  // not count against a worker: after one ends, each has a lease TTL to be
  // heard from again.
  const bool disrupted = ttl > options_.lease_ttl;
  const absl::Duration counted =
      disrupted ? quiet : std::min(quiet, now - disrupted_at_);
  if (counted > ttl) {
    MarkDownLocked(info,
                   absl::StrCat("lease expired (no heartbeat for ",
                                absl::FormatDuration(silent),
                                info.last_activity == absl::InfinitePast()
                                    ? std::string()
                                    : absl::StrCat(", no stream data for ",
                                                   absl::FormatDuration(quiet)),
                                disrupted ? "; every worker silent past the "
                                            "disruption TTL"
                                          : "",
                                ")"));
  } else if (counted > options_.lease_ttl) {
    // Every worker silent at once: no new requests until it is heard from.
    info.health = WorkerHealth::kSuspect;
  } else if (silent > options_.suspect_after &&
             info.health == WorkerHealth::kHealthy) {
    info.health = WorkerHealth::kSuspect;
  }
  if (info.health != WorkerHealth::kDown && !info.engine_stalled &&
      HasEngineWork(info.load) &&
      now - info.last_progress > options_.engine_stall_after) {
    info.engine_stalled = true;
    MarkDownLocked(
        info,
        absl::StrCat("engine wedged: no step for ",
                     absl::FormatDuration(now - info.last_progress), " with ",
                     info.load.running_sequences, " sequences running and ",
                     info.load.queued_prefill_tokens,
                     " prompt tokens queued (step count ",
                     info.load.engine_steps, ")"));
  }
}

void WorkerRegistry::MarkDownLocked(WorkerInfo& info, std::string reason) {
  info.health = WorkerHealth::kDown;
  info.load.kv_blocks_free = info.load.kv_blocks_total;
  info.load.kv_blocks_reserved = 0;
  info.load.queued_prefill_tokens = 0;
  info.load.unowned_prefill_tokens = 0;
  info.load.unowned_sequences = 0;
  info.load.running_sequences = 0;
  pending_down_.push_back(
      DownEvent{info.ref, std::move(reason), info.leased_request_ids});
  info.leased_request_ids.clear();
}

std::vector<DownEvent> WorkerRegistry::Tick() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  const absl::Duration ttl = LeaseLocked(now);
  for (auto& [id, info] : workers_) UpdateHealthLocked(info, now, ttl);
  std::vector<DownEvent> events;
  events.swap(pending_down_);
  std::sort(events.begin(), events.end(),
            [](const DownEvent& a, const DownEvent& b) {
              return a.worker < b.worker;
            });
  return events;
}

std::vector<WorkerInfo> WorkerRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerInfo> out;
  out.reserve(workers_.size());
  for (const auto& [id, info] : workers_) out.push_back(info);
  return out;
}

std::vector<WorkerInfo> WorkerRegistry::ListWithoutLeases() const {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerInfo> out;
  out.reserve(workers_.size());
  for (const auto& [id, info] : workers_) {
    WorkerInfo& copy = out.emplace_back();
    copy.ref = info.ref;
    copy.registration = info.registration;
    copy.health = info.health;
    copy.load = info.load;
    copy.last_heartbeat = info.last_heartbeat;
    copy.last_activity = info.last_activity;
    copy.last_progress = info.last_progress;
    copy.engine_stalled = info.engine_stalled;
  }
  return out;
}

absl::StatusOr<WorkerInfo> WorkerRegistry::Get(absl::string_view id) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("worker '", id, "' is not registered"));
  }
  return it->second;
}

}  // namespace baton::coordinator
