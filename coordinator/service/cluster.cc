#include "coordinator/service/cluster.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/grpc/keepalive.h"
#include "common/tsan/annotations.h"

namespace baton::coordinator {
namespace {

void Log(const std::string& line) {
  std::fprintf(stderr, "baton-coordinator: %s\n", line.c_str());
}

// One Worker.Cancel in flight; deletes itself when it completes.
struct PendingCancel {
  grpc::ClientContext context;
  v1::CancelRequest request;
  v1::CancelResponse response;
  std::shared_ptr<v1::Worker::Stub> stub;  // keeps the channel alive
  std::string worker;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Create(
    const ClusterOptions& options, std::unique_ptr<ServedModel> model,
    const Clock* clock) {
  if (model == nullptr || clock == nullptr) {
    return absl::InvalidArgumentError("Cluster: model and clock are required");
  }
  if (options.sweep_interval <= absl::ZeroDuration() ||
      options.queue_timeout < absl::ZeroDuration() ||
      options.transfer_timeout <= absl::ZeroDuration() ||
      options.worker_rpc_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "Cluster: sweep_interval, transfer_timeout and worker_rpc_timeout "
        "must be > 0 and queue_timeout >= 0");
  }
  if (absl::Status s = ValidateAdmissionOptions(options.admission); !s.ok()) {
    return s;
  }
  if (options.call_threads < 1 || options.call_threads > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "call_threads: ", options.call_threads, " is outside [1, 64]"));
  }
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_attempts: ", options.max_attempts, " must be >= 1"));
  }
  if (options.max_migrations < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_migrations: ", options.max_migrations, " must be >= 0"));
  }
  std::unique_ptr<RoutingPolicy> policy;
  if (options.policy == "least_loaded") {
    if (!(options.prefix_weight >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prefix_weight: ", options.prefix_weight, " must be >= 0"));
    }
    policy = NewLeastLoadedPolicy(options.prefix_weight);
  } else if (options.policy == "round_robin") {
    policy = NewRoundRobinPolicy();
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("policy: '", options.policy,
                     "' is not one of least_loaded, round_robin"));
  }
  auto registry = WorkerRegistry::Create(options.registry, clock);
  if (!registry.ok()) return registry.status();
  ClusterOptions named = options;
  if (named.coordinator_id.empty()) {
    std::random_device random;
    named.coordinator_id =
        absl::StrCat("c-", absl::Hex(random(), absl::kZeroPad8));
  }
  std::unique_ptr<Cluster> cluster(new Cluster(
      named, std::move(model), clock, std::move(*registry), std::move(policy)));
  Cluster* self = cluster.get();
  cluster->scrape_hook_ = metrics::AddScrapeHook(
      [self] { self->metrics_->SetWorkers(self->registry_->List()); });
  cluster->sweeper_ = std::thread([self] {
    while (!self->stop_.WaitForNotificationWithTimeout(
        self->options_.sweep_interval)) {
      self->Sweep();
    }
  });
  return cluster;
}

Cluster::Cluster(const ClusterOptions& options,
                 std::unique_ptr<ServedModel> model, const Clock* clock,
                 std::unique_ptr<WorkerRegistry> registry,
                 std::unique_ptr<RoutingPolicy> policy)
    : options_(options),
      clock_(clock),
      model_(std::move(model)),
      registry_(std::move(registry)),
      policy_(std::move(policy)),
      requests_(RequestStateMachineOptions{
          // Reservations refused are retried until queue_timeout instead.
          .max_decode_attempts = 1 << 30,
          .max_attempts = options.max_attempts,
          .max_migrations = options.max_migrations,
          .queue_timeout = options.queue_timeout,
          .transfer_timeout = options.transfer_timeout,
          .clock = clock}),
      metrics_(std::make_unique<CoordinatorMetrics>(
          options.metrics_registry != nullptr ? *options.metrics_registry
                                              : metrics::Registry())),
      executor_(std::make_unique<async::Executor>(options.call_threads)) {}

Cluster::~Cluster() {
  scrape_hook_.reset();
  Shutdown();
  stop_.Notify();
  sweeper_.join();
  // Runs what the ended calls posted last, then joins its threads.
  executor_.reset();
}

int Cluster::Drain(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  mu_.AwaitWithTimeout(
      absl::Condition(
          +[](std::map<std::string, std::shared_ptr<CallHandle>>* c) {
            return c->empty();
          },
          &calls_),
      timeout);
  return static_cast<int>(calls_.size());
}

void Cluster::Shutdown() {
  std::vector<std::shared_ptr<CallHandle>> calls;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    for (auto& [id, call] : calls_) calls.push_back(call);
  }
  absl::Status shutdown = absl::UnavailableError("coordinator shutting down");
  shutdown.SetPayload(kShutdownPayload, absl::Cord());
  for (auto& call : calls) call->Abort("", shutdown);
  calls.clear();
  {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(
        absl::Condition(
            +[](std::map<std::string, std::shared_ptr<CallHandle>>* c) {
              return c->empty();
            },
            &calls_),
        absl::Seconds(10));
  }
}

std::shared_ptr<v1::Worker::Stub> Cluster::WorkerStub(
    const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto it = stubs_.find(address);
  if (it != stubs_.end()) return it->second;
  grpc::ChannelArguments args;
  // A restarted worker at the same address must be reachable at once.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A worker whose host vanished fails its streams within keepalive.
  SetClientKeepalive(&args);
  std::shared_ptr<v1::Worker::Stub> stub = v1::Worker::NewStub(
      grpc::CreateCustomChannel(address,
                                options_.worker_credentials != nullptr
                                    ? options_.worker_credentials
                                    : grpc::InsecureChannelCredentials(),
                                args));
  stubs_[address] = stub;
  return stub;
}

absl::Status Cluster::Heartbeat(const WorkerRef& worker, WorkerLoad load,
                                const std::vector<std::string>& leased) {
  // Under the routing lock: no prompt is sent to the worker between the
  // count read here and the registry's update.
  absl::MutexLock claim(&claim_mu_);
  const RequestLoad own = requests_.LoadOn(worker.id);
  load.unowned_prefill_tokens =
      std::max<int64_t>(0, load.queued_prefill_tokens - own.prefill_tokens);
  load.unowned_sequences = static_cast<int32_t>(
      std::max<int64_t>(0, int64_t{load.running_sequences} - own.sequences));
  return registry_->Heartbeat(worker, load, leased);
}

Candidates Cluster::RoutingCandidates() const {
  // Per request: no worker's leased ids and no copy of the loads' map.
  Candidates candidates = registry_->ListWithoutLeases();
  std::vector<RequestLoad> loads(candidates.size());
  requests_.VisitLoads([&](const WorkerId& id, const RequestLoad& load) {
    // Both are sorted by worker id (the registry's map and the loads').
    const auto it =
        std::lower_bound(candidates.begin(), candidates.end(), id,
                         [](const WorkerInfo& w, const WorkerId& key) {
                           return w.ref.id < key;
                         });
    if (it != candidates.end() && it->ref.id == id) {
      loads[static_cast<size_t>(it - candidates.begin())] = load;
    }
  });
  for (size_t i = 0; i < candidates.size(); ++i) {
    WorkerInfo& w = candidates[i];
    const RequestLoad& load = loads[i];
    // Its own prompts as it knows them now, plus what the last heartbeat
    // counted beyond those (other replicas'): a prompt prefilled since that
    // heartbeat no longer counts, where the heartbeat's figure still did.
    w.load.queued_prefill_tokens =
        load.prefill_tokens + w.load.unowned_prefill_tokens;
    if (CanDecode(w.registration.role)) {
      // The coordinator knows every reservation it made, so its count is
      // current where the heartbeat's lags behind frees and reservations.
      w.load.kv_blocks_free = std::max<int64_t>(
          0, w.registration.kv_blocks_total - load.decode_blocks);
      // Likewise the sequences decoding there (the least-loaded policy's
      // tie-break): a heartbeat up to an interval old still counts
      // requests that have ended and misses ones just sent.
      w.load.running_sequences =
          static_cast<int32_t>(load.sequences + w.load.unowned_sequences);
    }
  }
  return candidates;
}

void Cluster::FillCachedTokens(const Candidates& pool,
                               RequestInfo* request) const {
  if (request->prompt_ids == nullptr || request->prompt_ids->empty()) return;
  const std::vector<int32_t>& prompt = *request->prompt_ids;
  // One chain per (root, block size), matched against the index once for
  // every worker: workers of one model share it.
  struct Chain {
    BlockHash root;
    int64_t block_size;
    absl::flat_hash_map<WorkerId, int64_t> matched;
  };
  std::vector<Chain> chains;
  for (const WorkerInfo& w : pool) {
    if (!w.registration.prefix_root.has_value()) continue;
    const int64_t block_size = w.registration.kv_layout.block_size;
    if (block_size < 1) continue;
    const BlockHash& root = *w.registration.prefix_root;
    auto it = std::find_if(chains.begin(), chains.end(), [&](const Chain& c) {
      return c.root == root && c.block_size == block_size;
    });
    if (it == chains.end()) {
      std::vector<BlockHash> chain;
      // Workers never share the block of the last prompt token.
      ExtendBlockHashes(root, prompt, block_size,
                        (static_cast<int64_t>(prompt.size()) - 1) / block_size,
                        &chain);
      chains.push_back({root, block_size, prefix_index_.MatchAll(chain)});
      it = chains.end() - 1;
    }
    auto found = it->matched.find(w.ref.id);
    if (found != it->matched.end() && found->second > 0) {
      request->cached_tokens[w.ref.id] = found->second * block_size;
    }
  }
}

absl::StatusOr<WorkerInfo> Cluster::ClaimPrefill(
    WorkerRole role, const RequestInfo& request,
    const std::string& attempt_id) {
  absl::MutexLock claim(&claim_mu_);
  Candidates pool;
  for (WorkerInfo& w : RoutingCandidates()) {
    if (w.registration.role == role) pool.push_back(std::move(w));
  }
  RequestInfo info = request;
  FillCachedTokens(pool, &info);
  absl::StatusOr<WorkerRef> picked = policy_->PickPrefill(pool, info);
  if (!picked.ok()) return picked.status();
  for (const WorkerInfo& w : pool) {
    if (w.ref == *picked) {
      absl::StatusOr<Transition> started = requests_.StartPrefill(
          attempt_id, w.ref, /*split=*/role == WorkerRole::kPrefill);
      if (!started.ok()) return started.status();
      return w;
    }
  }
  return absl::InternalError("routing picked a worker outside the pool");
}

absl::StatusOr<WorkerInfo> Cluster::ClaimDecode(const RequestInfo& request,
                                                const std::string& attempt_id,
                                                bool wait,
                                                LocalPrefill* local) {
  absl::MutexLock claim(&claim_mu_);
  const Candidates all = RoutingCandidates();
  RequestInfo info = request;
  FillCachedTokens(all, &info);
  absl::StatusOr<WorkerRef> picked =
      wait ? PickDecodeQueue(all, info) : policy_->PickDecode(all, info);
  if (!picked.ok()) return picked.status();
  for (const WorkerInfo& w : all) {
    if (w.ref == *picked) {
      if (const int64_t in_flight =
              wait ? requests_.LoadOn(w.ref.id).grants_in_flight : 0;
          in_flight > 0) {
        absl::Status held = absl::UnavailableError(
            absl::StrCat(in_flight, " KV reservations granted earlier on ",
                         w.ref.id, " are not answered yet"));
        held.SetPayload(kGrantsInFlightPayload, absl::Cord());
        return held;
      }
      const int64_t blocks =
          DecodeBlocksNeeded(request, w.registration.kv_layout.block_size);
      if (local != nullptr && !wait &&
          PrefillLocally(info, w.ref.id, options_.local_prefill_tokens) &&
          std::find(local->not_on.begin(), local->not_on.end(), w.ref.id) ==
              local->not_on.end()) {
        absl::StatusOr<Transition> started =
            requests_.StartPrefill(attempt_id, w.ref, /*split=*/false, blocks);
        if (!started.ok()) return started.status();
        local->chosen = true;
        return w;
      }
      absl::StatusOr<Transition> reserved =
          requests_.ReserveDecode(attempt_id, w.ref, blocks, wait);
      if (!reserved.ok()) return reserved.status();
      return w;
    }
  }
  return absl::InternalError("routing picked a worker outside the pool");
}

void Cluster::PerformCleanup(const Transition& transition) {
  if (transition.new_attempt) {
    if (transition.migration) {
      metrics_->OnMigration();
    } else {
      metrics_->OnRetry();
    }
    Log(absl::StrCat("request ", transition.request_id,
                     transition.migration ? " migrates" : " starts over",
                     " (attempt ", transition.attempt_id,
                     " ended): ", transition.status.message()));
  }
  for (const CleanupAction& action : transition.actions) {
    auto worker = registry_->Get(action.worker.id);
    if (!worker.ok()) continue;
    auto* pending = new PendingCancel();
    pending->stub = WorkerStub(worker->registration.address);
    pending->worker = WorkerRefString(action.worker);
    pending->request.set_request_id(action.request_id);
    pending->request.set_reason(absl::StrCat(
        RequestStateName(transition.to), ": ", transition.status.message()));
    pending->context.set_deadline(
        std::chrono::system_clock::now() +
        absl::ToChronoMilliseconds(options_.worker_rpc_timeout));
    BATON_TSAN_RELEASE(pending);  // the callback runs on a gRPC thread
    pending->stub->async()->Cancel(
        &pending->context, &pending->request, &pending->response,
        [pending](grpc::Status status) {
          BATON_TSAN_ACQUIRE(pending);
          if (!status.ok()) {
            Log(absl::StrCat("Cancel of ", pending->request.request_id(),
                             " on ", pending->worker,
                             " failed: ", status.error_message()));
          }
          delete pending;
        });
  }
}

void Cluster::AddCall(const std::string& request_id,
                      std::shared_ptr<CallHandle> call) {
  absl::MutexLock lock(&mu_);
  calls_[request_id] = std::move(call);
}

void Cluster::RemoveCall(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  calls_.erase(request_id);
}

AdmissionVerdict Cluster::Admit(const RequestInfo& request) {
  absl::MutexLock claim(&claim_mu_);
  AdmissionVerdict verdict;
  if (options_.admission.ttft_slo > absl::ZeroDuration()) {
    const Candidates all = RoutingCandidates();
    RequestInfo info = request;
    FillCachedTokens(all, &info);
    verdict =
        coordinator::Admit(options_.admission, all, info, waiting_, running_);
  } else {  // the queue bound needs no view of the workers
    verdict =
        coordinator::Admit(options_.admission, {}, request, waiting_, running_);
  }
  if (verdict.status.ok()) {
    ++waiting_;
    ++running_;
  } else {
    metrics_->OnRequestShed(verdict.reason, verdict.status);
  }
  metrics_->SetWaiting(waiting_);
  return verdict;
}

void Cluster::EndWaiting() {
  absl::MutexLock claim(&claim_mu_);
  if (waiting_ > 0) --waiting_;
  metrics_->SetWaiting(waiting_);
}

void Cluster::EndRunning() {
  absl::MutexLock claim(&claim_mu_);
  if (running_ > 0) --running_;
}

int64_t Cluster::waiting_requests() const {
  absl::MutexLock claim(&claim_mu_);
  return waiting_;
}

int Cluster::active_calls() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(calls_.size());
}

bool Cluster::accepting() const {
  absl::MutexLock lock(&mu_);
  return !shutting_down_;
}

void Cluster::Apply(const std::vector<Transition>& transitions) {
  for (const Transition& t : transitions) {
    PerformCleanup(t);
    // The call learns what comes next from the state machine.
    if (!IsTerminal(t.to) && !t.new_attempt) continue;
    std::shared_ptr<CallHandle> call;
    {
      absl::MutexLock lock(&mu_);
      auto it = calls_.find(t.request_id);
      if (it != calls_.end()) call = it->second;
    }
    if (call != nullptr) call->Abort(t.attempt_id, t.status);
  }
}

void Cluster::Sweep() {
  for (const DownEvent& down : registry_->Tick()) {
    Log(absl::StrCat("worker ", WorkerRefString(down.worker),
                     " is down: ", down.reason));
    // Its cache is no routing hint now, and is kept no longer (unless the
    // id registered again since: that registration's snapshot stands).
    if (const absl::StatusOr<WorkerInfo> now = registry_->Get(down.worker.id);
        !now.ok() || now->ref.epoch == down.worker.epoch) {
      prefix_index_.Forget(down.worker.id);
    }
    Apply(requests_.OnWorkerDown(down.worker));
  }
  Apply(requests_.ExpireDeadlines(clock_->Now()));
}

}  // namespace baton::coordinator
