// GenerateCall's routing: the decode worker with room (reserved first), then
// the prefill worker, or one `both` worker for colocated serving; and the
// workers a failed attempt excludes from the next one.
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

async::Task<absl::Status> GenerateCall::Route() {
  const std::string& model_id = cluster_->model().id();
  RequestInfo info = RoutingInfo(job_, model_id);
  // A migrating request avoids the decode workers that failed it.
  const std::vector<WorkerId> failed_decode = StillExcluded(excluded_decode_);
  info.excluded = failed_decode;
  const absl::Time queue_deadline =
      std::min(job_.deadline, absl::Now() + cluster_->options().queue_timeout);
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

    int64_t blocks = 0;
    absl::StatusOr<WorkerInfo> decode = cluster_->ClaimDecode(info, &blocks);
    if (!decode.ok()) {
      // No decode worker up at all (other than those that failed it).
      if (decode.status().code() == absl::StatusCode::kUnavailable &&
          info.excluded.size() == failed_decode.size()) {
        // Late heartbeats only (the coordinator, its host or the network
        // stalled): wait for a decode worker to be heard from again.
        if (!AnySuspect(all, info, &CanDecode) ||
            absl::Now() >= queue_deadline) {
          co_return decode.status();
        }
        if (!co_await Backoff(backoff)) continue;
        backoff = std::min(backoff * 2, absl::Milliseconds(100));
        continue;
      }
      int64_t largest = 0;
      int64_t block_size = 0;
      for (const WorkerInfo& w : all) {
        if (!CanDecode(w.registration.role) ||
            w.health != WorkerHealth::kHealthy ||
            w.registration.model_id != model_id) {
          continue;
        }
        if (w.registration.kv_blocks_total > largest) {
          largest = w.registration.kv_blocks_total;
          block_size = w.registration.kv_layout.block_size;
        }
      }
      if (block_size > 0 && DecodeBlocksNeeded(info, block_size) > largest) {
        co_return absl::ResourceExhaustedError(absl::StrCat(
            "prompt (", info.prompt_tokens, " tokens) + max_tokens (",
            info.max_tokens, ") needs ", DecodeBlocksNeeded(info, block_size),
            " KV blocks; the largest decode worker has ", largest));
      }
      if (absl::Now() >= queue_deadline) {
        co_return absl::ResourceExhaustedError(absl::StrCat(
            "no decode worker had room for the request within ",
            absl::FormatDuration(cluster_->options().queue_timeout), " (",
            decode.status().message(), ")"));
      }
      // None has room (or each refused): wait in one worker's line, where
      // the calls of every coordinator replica are served in arrival order
      // (ReserveKvRequest.queue_ms), rather than polling here, where this
      // replica would learn of freed room only from heartbeats.
      info.excluded = failed_decode;
      decode = cluster_->ClaimDecode(info, &blocks, /*wait=*/true);
      if (!decode.ok()) {
        if (!co_await Backoff(backoff)) continue;
        backoff = std::min(backoff * 2, absl::Milliseconds(100));
        continue;
      }
      wait = true;
    }
    const WorkerInfo target = *decode;
    auto reserved =
        cluster_->requests().ReserveDecode(job_.internal_id, target.ref);
    if (!reserved.ok()) {
      cluster_->AddDecodeBlocks(target.ref.id, -blocks);
      co_return reserved.status();
    }
    v1::ReserveKvRequest request;
    request.set_request_id(job_.internal_id);
    request.set_model_id(model_id);
    request.set_coordinator_id(cluster_->options().coordinator_id);
    request.set_num_prompt_tokens(static_cast<int32_t>(job_.prompt.size()));
    // The worker pins what its prefix cache holds of it; only the rest moves.
    request.mutable_prompt_token_ids()->Add(job_.prompt.begin(),
                                            job_.prompt.end());
    request.set_max_tokens(job_.sampling.max_tokens());
    request.add_transports(v1::KV_TRANSPORT_HOST_TCP);
    const absl::Duration queue_wait =
        wait ? std::max(queue_deadline - absl::Now(), absl::ZeroDuration())
             : absl::ZeroDuration();
    request.set_queue_ms(absl::ToDoubleMilliseconds(queue_wait));
    // The reservation outlives the request's deadline by a little at most
    // (the worker's default TTL when the request has none).
    if (job_.deadline != absl::InfiniteFuture()) {
      request.set_reservation_ttl_ms(absl::ToDoubleMilliseconds(
          std::max(job_.deadline - absl::Now(), absl::ZeroDuration()) +
          absl::Seconds(5)));
    }
    grpc::ClientContext context;
    context.set_deadline(
        std::min(absl::ToChronoTime(job_.deadline),
                 absl::ToChronoTime(absl::Now() + queue_wait +
                                    cluster_->options().worker_rpc_timeout)));
    grpc::Status rpc;
    {
      ScopedContext scoped(this, &context);
      std::shared_ptr<v1::Worker::Stub> stub =
          cluster_->WorkerStub(target.registration.address);
      rpc = co_await async::Unary(
          &cluster_->executor(), [&](std::function<void(grpc::Status)> done) {
            stub->async()->ReserveKv(&context, &request, &reservation_,
                                     std::move(done));
          });
    }
    if (rpc.ok()) {
      decode_ = target;
      decode_blocks_ = blocks;
      absl::Status claimed =
          co_await ClaimPrefill(WorkerRole::kPrefill, info, queue_deadline);
      co_return claimed;
    }
    cluster_->AddDecodeBlocks(target.ref.id, -blocks);
    // Aborted: the abort edge frees the reservation (the lease stays).
    if (absl::Status s = aborted(); !s.ok()) co_return s;
    const absl::Status why = WorkerError(target, WorkerRpc::kReserveKv, rpc);
    const grpc::StatusCode code = rpc.error_code();
    auto refused = cluster_->requests().OnReserveRefused(job_.internal_id,
                                                         target.ref, why);
    if (!refused.ok()) co_return refused.status();
    if (code != grpc::StatusCode::RESOURCE_EXHAUSTED &&
        code != grpc::StatusCode::INVALID_ARGUMENT &&
        code != grpc::StatusCode::FAILED_PRECONDITION) {
      // The worker may have reserved before the reply was lost.
      Transition cleanup;
      cleanup.to = RequestState::kQueued;
      cleanup.status = why;
      cleanup.actions.push_back(FreeKv(target.ref, job_.internal_id));
      cluster_->PerformCleanup(cleanup);
    }
    if (IsTerminal(refused->to)) co_return refused->status;
    if (wait && code == grpc::StatusCode::RESOURCE_EXHAUSTED &&
        absl::Now() >= queue_deadline) {
      co_return absl::ResourceExhaustedError(
          absl::StrCat("no decode worker had room for the request within ",
                       absl::FormatDuration(cluster_->options().queue_timeout),
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
    absl::StatusOr<WorkerInfo> prefill = cluster_->ClaimPrefill(role, info);
    if (prefill.ok()) {
      prefill_ = *prefill;
      prefill_tokens_added_ = info.prompt_tokens;
      co_return absl::OkStatus();
    }
    // As for decode: a pool whose heartbeats are only late is waited for.
    if (prefill.status().code() != absl::StatusCode::kUnavailable ||
        absl::Now() >= queue_deadline ||
        !AnySuspect(cluster_->RoutingCandidates(), info, in_pool)) {
      co_return prefill.status();
    }
    if (!co_await Backoff(backoff)) co_return aborted();
    backoff = std::min(backoff * 2, absl::Milliseconds(100));
  }
}

bool GenerateCall::ExcludeFailedWorker(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kUnavailable) return false;
  if (const auto down = status.GetPayload(kWorkerDownPayload)) {
    const std::string worker(*down);
    if (decode_.has_value() && worker == decode_->ref.id) {
      excluded_decode_.push_back(decode_->ref);
    }
    if (worker == prefill_->ref.id) excluded_prefill_.push_back(prefill_->ref);
    return true;
  }
  if (FromWorkerRpc(status, WorkerRpc::kPrefill)) {
    excluded_prefill_.push_back(prefill_->ref);
    return true;
  }
  if (decode_.has_value() && FromWorkerRpc(status, WorkerRpc::kDecode)) {
    excluded_decode_.push_back(decode_->ref);
    return true;
  }
  // Either side of the handoff may have failed: exclude neither (a dead
  // one fails its next RPC at once, or is DOWN by then).
  return FromWorkerRpc(status, WorkerRpc::kPrefillHandoff);
}

void GenerateCall::NewAttempt(absl::string_view suffix) {
  const std::string previous = job_.internal_id;
  job_.internal_id = absl::StrCat(previous, suffix);
  {
    absl::MutexLock lock(&mu_);
    attempt_id_ = job_.internal_id;
    attempt_abort_ = absl::OkStatus();
  }
  cluster_->AddCall(job_.internal_id, shared_from_this());
  cluster_->RemoveCall(previous);
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
