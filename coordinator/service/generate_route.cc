// GenerateCall's routing: the decode worker with room (reserved first), then
// the prefill worker, or one `both` worker for colocated serving, or the
// decode worker that holds nearly all of the prompt, colocated there;
// avoiding the workers the state machine excluded after failed attempts.
#include <algorithm>
#include <functional>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/grpc/async_call.h"
#include "coordinator/service/generate_call.h"
#include "coordinator/service/generate_call_internal.h"

namespace baton::coordinator {

RequestInfo RoutingInfo(const GenerateJob& job, const std::string& model_id) {
  RequestInfo info;
  info.model_id = model_id;
  info.prompt_tokens = static_cast<int64_t>(job.prompt.size());
  info.max_tokens = job.sampling.max_tokens();
  info.prompt_ids = &job.prompt;
  return info;
}

namespace {

// How often a request held back by reservations still on their way
// (kGrantsInFlightPayload) looks again.
constexpr absl::Duration kGrantPoll = absl::Milliseconds(1);

// A request that no decode worker up can ever hold: FAILED_PRECONDITION
// (HTTP 400; retrying cannot help until a larger worker joins), naming what
// would fit.
absl::Status NeverFits(const RequestInfo& info, const DecodeCapacity& largest) {
  const int64_t room = largest.tokens() - info.prompt_tokens;
  return absl::FailedPreconditionError(absl::StrCat(
      "prompt (", info.prompt_tokens, " tokens) + max_tokens (",
      info.max_tokens, ") needs ", DecodeBlocksNeeded(info, largest.block_size),
      " KV blocks; the largest decode worker has ", largest.blocks, " (",
      largest.tokens(), " tokens: ",
      room > 0 ? absl::StrCat("max_tokens <= ", room, " fits this prompt)")
               : std::string("the prompt alone does not fit)")));
}

}  // namespace

async::Task<absl::Status> GenerateCall::Route() {
  const std::string& model_id = cluster_->model().id();
  RequestInfo info = RoutingInfo(job_, model_id);
  // A migrating request avoids the decode workers that failed it.
  const std::vector<WorkerId> failed_decode = StillExcluded(excluded_decode_);
  info.excluded = failed_decode;
  // The state machine's queue timer for this attempt (its sweep fails the
  // request there too, unless a reservation is waiting at a worker).
  const Clock& clock = cluster_->clock();
  const absl::Time queue_deadline = std::min(job_.deadline, queue_deadline_);
  absl::Duration backoff = absl::Milliseconds(5);
  while (true) {
    // True when the ReserveKv below waits at the worker for room.
    bool wait = false;
    if (absl::Status s = aborted(); !s.ok()) co_return s;
    const Candidates all = cluster_->RoutingCandidates();
    // Split serving when a prefill-only worker is up; otherwise colocated
    // on a `both` worker.
    if (PrefillRole(all, model_id) == WorkerRole::kBoth) {
      absl::Status claimed =
          co_await ClaimPrefill(WorkerRole::kBoth, info, queue_deadline);
      co_return claimed;
    }
    // A decode worker that holds all but a few tokens of the prompt (the
    // last turn's history) prefills them itself, unless it failed this
    // request's prefill before: nothing moves (local_prefill_tokens > 0).
    LocalPrefill local;
    local.not_on = StillExcluded(excluded_prefill_);
    absl::StatusOr<WorkerInfo> decode =
        cluster_->ClaimDecode(info, attempt_, /*wait=*/false, &local);
    if (decode.ok() && local.chosen) {
      prefill_ = *decode;
      cluster_->metrics().OnLocalPrefill();
      co_return absl::OkStatus();
    }
    if (!decode.ok()) {
      // No decode worker up at all (other than those that failed it).
      if (decode.status().code() == absl::StatusCode::kUnavailable &&
          info.excluded.size() == failed_decode.size()) {
        // Late heartbeats only (the coordinator, its host or the network
        // stalled): wait for a decode worker to be heard from again.
        if (!AnySuspect(all, info, &CanDecode) ||
            clock.Now() >= queue_deadline) {
          co_return decode.status();
        }
        if (!co_await Backoff(backoff)) continue;
        backoff = std::min(backoff * 2, absl::Milliseconds(100));
        continue;
      }
      if (const DecodeCapacity largest = LargestDecodePool(all, model_id);
          largest.block_size > 0 &&
          DecodeBlocksNeeded(info, largest.block_size) > largest.blocks) {
        co_return NeverFits(info, largest);
      }
      if (clock.Now() >= queue_deadline) {
        co_return absl::ResourceExhaustedError(absl::StrCat(
            QueueTimeoutMessage(cluster_->options().queue_timeout),
            " (no decode worker: ", decode.status().message(), ")"));
      }
      // None has room (or each refused): wait in one worker's line, where
      // the calls of every coordinator replica are served in arrival order
      // (ReserveKvRequest.queue_ms), rather than polling here, where this
      // replica would learn of freed room only from heartbeats.
      info.excluded = failed_decode;
      decode = cluster_->ClaimDecode(info, attempt_, /*wait=*/true);
      if (!decode.ok()) {
        if (decode.status().GetPayload(kGrantsInFlightPayload).has_value()) {
          // Answered within a round trip, mostly: look again soon, ahead
          // of the requests that come later (an abort is seen at the top).
          static_cast<void>(co_await Backoff(kGrantPoll));
          continue;
        }
        if (!co_await Backoff(backoff)) continue;
        backoff = std::min(backoff * 2, absl::Milliseconds(100));
        continue;
      }
      wait = true;
    }
    // Reserved in the state machine (its lease and load start now).
    const WorkerInfo target = *decode;
    v1::ReserveKvRequest request;
    request.set_request_id(attempt_);
    request.set_model_id(model_id);
    request.set_coordinator_id(cluster_->options().coordinator_id);
    request.set_num_prompt_tokens(static_cast<int32_t>(job_.prompt.size()));
    // The worker pins what its prefix cache holds of it; only the rest moves.
    request.mutable_prompt_token_ids()->Add(job_.prompt.begin(),
                                            job_.prompt.end());
    request.set_max_tokens(job_.sampling.max_tokens());
    request.set_arrival_unix_micros(absl::ToUnixMicros(job_.arrival));
    request.add_transports(v1::KV_TRANSPORT_HOST_TCP);
    const absl::Duration queue_wait =
        wait ? std::max(queue_deadline - clock.Now(), absl::ZeroDuration())
             : absl::ZeroDuration();
    request.set_queue_ms(absl::ToDoubleMilliseconds(queue_wait));
    // The reservation outlives the request's deadline by a little at most
    // (the worker's default TTL when the request has none).
    if (job_.deadline != absl::InfiniteFuture()) {
      request.set_reservation_ttl_ms(absl::ToDoubleMilliseconds(
          std::max(job_.deadline - absl::Now(), absl::ZeroDuration()) +
          absl::Seconds(5)));
    }
    if (!wait && cluster_->options().overlap_reserve_kv &&
        attempt_ == job_.internal_id && target.registration.kv_device.empty()) {
      // The pool has room in this replica's view: Serve makes the
      // reservation beside the Prefill. A refusal ends the attempt, and
      // the next one (any but the first) reserves first.
      decode_ = target;
      overlap_request_ = std::move(request);
      co_return co_await ClaimPrefill(WorkerRole::kPrefill, info,
                                      queue_deadline);
    }
    grpc::ClientContext context;
    context.set_deadline(
        std::min(absl::ToChronoTime(job_.deadline),
                 absl::ToChronoTime(absl::Now() + queue_wait +
                                    cluster_->options().worker_rpc_timeout)));
    grpc::Status rpc;
    const SteadyClock::time_point sent = SteadyClock::now();
    SteadyClock::time_point replied;
    {
      ScopedContext scoped(this, &context);
      std::shared_ptr<v1::Worker::Stub> stub =
          cluster_->WorkerStub(target.registration.address);
      rpc = co_await async::Unary(
          &cluster_->executor(),
          [&](grpc::ClientUnaryReactor* reactor) {
            stub->async()->ReserveKv(&context, &request, &reservation_,
                                     reactor);
          },
          &replied);
    }
    if (rpc.ok()) {
      decode_ = target;
      // (An attempt over meanwhile holds nothing to mark.)
      static_cast<void>(cluster_->requests().OnReserved(attempt_));
      if (!streamed_) reserve_kv_ms_ = MsBetween(sent, replied);
      absl::Status claimed =
          co_await ClaimPrefill(WorkerRole::kPrefill, info, queue_deadline);
      co_return claimed;
    }
    // Aborted: ending the attempt frees the reservation (the lease stays).
    if (absl::Status s = aborted(); !s.ok()) co_return s;
    const absl::Status why = WorkerError(target, WorkerRpc::kReserveKv, rpc);
    const grpc::StatusCode code = rpc.error_code();
    // Refused, or the reply was lost (the state machine then frees what the
    // worker may have reserved).
    auto refused =
        cluster_->requests().OnReserveRefused(attempt_, target.ref, why);
    if (!refused.ok()) {
      // The sweeper dropped the reservation first (its worker went DOWN):
      // the attempt goes on, routed elsewhere.
      auto now = cluster_->requests().Get(job_.internal_id);
      if (!now.ok() || now->state != RequestState::kQueued ||
          now->attempt_id != attempt_ || now->decode_worker.has_value()) {
        co_return refused.status();
      }
    } else {
      cluster_->PerformCleanup(*refused);
      if (IsTerminal(refused->to)) co_return refused->status;
    }
    if (wait && code == grpc::StatusCode::RESOURCE_EXHAUSTED &&
        clock.Now() >= queue_deadline) {
      co_return absl::ResourceExhaustedError(
          absl::StrCat(QueueTimeoutMessage(cluster_->options().queue_timeout),
                       " (", why.message(), ")"));
    }
    info.excluded.push_back(target.ref.id);
    if (wait) {  // e.g. that worker's line is full
      if (!co_await Backoff(backoff)) continue;
      backoff = std::min(backoff * 2, absl::Milliseconds(100));
    }
  }
}

async::Task<absl::Status> GenerateCall::ClaimPrefill(
    WorkerRole role, RequestInfo info, absl::Time queue_deadline) {
  info.excluded = StillExcluded(excluded_prefill_);
  bool (*in_pool)(WorkerRole) =
      role == WorkerRole::kBoth
          ? +[](WorkerRole r) { return r == WorkerRole::kBoth; }
          : +[](WorkerRole r) { return r == WorkerRole::kPrefill; };
  absl::Duration backoff = absl::Milliseconds(5);
  while (true) {
    absl::StatusOr<WorkerInfo> prefill =
        cluster_->ClaimPrefill(role, info, attempt_);
    if (prefill.ok()) {
      prefill_ = *prefill;
      co_return absl::OkStatus();
    }
    // As for decode: a pool whose heartbeats are only late is waited for.
    // A reservation lost to a DOWN worker ends the attempt instead.
    if (prefill.status().code() != absl::StatusCode::kUnavailable ||
        prefill.status().GetPayload(kWorkerDownPayload).has_value() ||
        cluster_->clock().Now() >= queue_deadline ||
        !AnySuspect(cluster_->RoutingCandidates(), info, in_pool)) {
      co_return prefill.status();
    }
    if (!co_await Backoff(backoff)) co_return aborted();
    backoff = std::min(backoff * 2, absl::Milliseconds(100));
  }
}

async::Detach GenerateCall::ReserveBesidePrefill(
    std::shared_ptr<GenerateCall> self, std::shared_ptr<Overlap> overlap,
    std::string attempt, WorkerInfo decode, WorkerInfo prefill) {
  async::Executor* const executor = &cluster_->executor();
  const auto deadline = std::min(
      absl::ToChronoTime(job_.deadline),
      absl::ToChronoTime(absl::Now() + cluster_->options().worker_rpc_timeout));
  absl::Status status;
  {
    grpc::ClientContext& context = overlap->reserve_context;
    context.set_deadline(deadline);
    ScopedContext scoped(this, &context);
    std::shared_ptr<v1::Worker::Stub> stub =
        cluster_->WorkerStub(decode.registration.address);
    const SteadyClock::time_point sent = SteadyClock::now();
    SteadyClock::time_point replied;
    const grpc::Status rpc = co_await async::Unary(
        executor,
        [&](grpc::ClientUnaryReactor* reactor) {
          stub->async()->ReserveKv(&context, &overlap->request,
                                   &overlap->reserved, reactor);
        },
        &replied);
    if (rpc.ok()) {
      overlap->reserve_ms = MsBetween(sent, replied);
      static_cast<void>(cluster_->requests().OnReserved(attempt));
    } else {
      status = WorkerError(decode, WorkerRpc::kReserveKvBesidePrefill, rpc);
    }
  }
  if (status.ok()) {
    v1::SetKvTargetRequest request;
    request.set_request_id(attempt);
    FillKvTarget(decode, overlap->reserved, request.mutable_kv_target());
    v1::SetKvTargetResponse response;
    grpc::ClientContext& context = overlap->target_context;
    context.set_deadline(deadline);
    ScopedContext scoped(this, &context);
    std::shared_ptr<v1::Worker::Stub> stub =
        cluster_->WorkerStub(prefill.registration.address);
    const grpc::Status rpc =
        co_await async::Unary(executor, [&](grpc::ClientUnaryReactor* reactor) {
          stub->async()->SetKvTarget(&context, &request, &response, reactor);
        });
    if (!rpc.ok()) status = WorkerError(prefill, WorkerRpc::kSetKvTarget, rpc);
  }
  overlap->status = status;
  // The attempt ends at once: its Prefill stream is cancelled, and Run asks
  // the state machine what comes next (after a refusal: another decode
  // worker). An attempt already over ignores it.
  if (!status.ok()) Abort(attempt, status);
  if (overlap->done.Arrive()) executor->Resume(overlap->waiter);
  static_cast<void>(self);
}

std::vector<WorkerId> GenerateCall::StillExcluded(
    const std::vector<WorkerRef>& failed) const {
  std::vector<WorkerId> out;
  for (const WorkerRef& ref : failed) {
    absl::StatusOr<WorkerInfo> now = cluster_->registry().Get(ref.id);
    if (now.ok() && now->ref.epoch != ref.epoch) continue;
    out.push_back(ref.id);
  }
  return out;
}

}  // namespace baton::coordinator
