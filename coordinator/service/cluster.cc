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
      // Reservations refused are retried until queue_timeout instead.
      requests_(RequestStateMachineOptions{.max_decode_attempts = 1 << 30}),
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

Candidates Cluster::RoutingCandidates() const {
  Candidates candidates = registry_->List();
  absl::MutexLock lock(&mu_);
  for (WorkerInfo& w : candidates) {
    if (auto it = prefill_tokens_.find(w.ref.id); it != prefill_tokens_.end()) {
      w.load.queued_prefill_tokens =
          std::max(w.load.queued_prefill_tokens, it->second);
    }
    if (CanDecode(w.registration.role)) {
      // The coordinator knows every reservation it made, so its count is
      // current where the heartbeat's lags behind frees and reservations.
      int64_t reserved = 0;
      if (auto it = decode_blocks_.find(w.ref.id); it != decode_blocks_.end()) {
        reserved = it->second;
      }
      w.load.kv_blocks_free =
          std::max<int64_t>(0, w.registration.kv_blocks_total - reserved);
    }
  }
  return candidates;
}

void Cluster::AddPrefillTokens(const WorkerId& worker, int64_t tokens) {
  absl::MutexLock lock(&mu_);
  if ((prefill_tokens_[worker] += tokens) <= 0) prefill_tokens_.erase(worker);
}

void Cluster::AddDecodeBlocks(const WorkerId& worker, int64_t blocks) {
  absl::MutexLock lock(&mu_);
  if ((decode_blocks_[worker] += blocks) <= 0) decode_blocks_.erase(worker);
}

void Cluster::FillCachedTokens(const Candidates& pool,
                               RequestInfo* request) const {
  if (request->prompt_ids == nullptr || request->prompt_ids->empty()) return;
  const std::vector<int32_t>& prompt = *request->prompt_ids;
  // One chain per (root, block size): workers of one model share it.
  std::vector<std::pair<std::pair<BlockHash, int64_t>, std::vector<BlockHash>>>
      chains;
  for (const WorkerInfo& w : pool) {
    if (!w.registration.prefix_root.has_value()) continue;
    const int64_t block_size = w.registration.kv_layout.block_size;
    if (block_size < 1) continue;
    const auto key = std::pair(*w.registration.prefix_root, block_size);
    auto it = std::find_if(chains.begin(), chains.end(),
                           [&](const auto& c) { return c.first == key; });
    if (it == chains.end()) {
      std::vector<BlockHash> chain;
      // Workers never share the block of the last prompt token.
      ExtendBlockHashes(key.first, prompt, block_size,
                        (static_cast<int64_t>(prompt.size()) - 1) / block_size,
                        &chain);
      chains.emplace_back(key, std::move(chain));
      it = chains.end() - 1;
    }
    const int64_t blocks = prefix_index_.MatchLength(w.ref.id, it->second);
    if (blocks > 0) request->cached_tokens[w.ref.id] = blocks * block_size;
  }
}

absl::StatusOr<WorkerInfo> Cluster::ClaimPrefill(WorkerRole role,
                                                 const RequestInfo& request) {
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
      AddPrefillTokens(w.ref.id, request.prompt_tokens);
      return w;
    }
  }
  return absl::InternalError("routing picked a worker outside the pool");
}

absl::StatusOr<WorkerInfo> Cluster::ClaimDecode(const RequestInfo& request,
                                                int64_t* blocks, bool wait) {
  absl::MutexLock claim(&claim_mu_);
  const Candidates all = RoutingCandidates();
  RequestInfo info = request;
  FillCachedTokens(all, &info);
  absl::StatusOr<WorkerRef> picked =
      wait ? PickDecodeQueue(all, info) : policy_->PickDecode(all, info);
  if (!picked.ok()) return picked.status();
  for (const WorkerInfo& w : all) {
    if (w.ref == *picked) {
      *blocks =
          DecodeBlocksNeeded(request, w.registration.kv_layout.block_size);
      AddDecodeBlocks(w.ref.id, *blocks);
      return w;
    }
  }
  return absl::InternalError("routing picked a worker outside the pool");
}

void Cluster::PerformCleanup(const Transition& transition) {
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
  transferring_since_.erase(request_id);
}

void Cluster::MarkTransferring(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  transferring_since_[request_id] = clock_->Now();
}

void Cluster::ClearTransferring(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  transferring_since_.erase(request_id);
}

AdmissionVerdict Cluster::Admit(const RequestInfo& request) {
  absl::MutexLock claim(&claim_mu_);
  AdmissionVerdict verdict;
  if (options_.admission.ttft_slo > absl::ZeroDuration()) {
    const Candidates all = RoutingCandidates();
    RequestInfo info = request;
    FillCachedTokens(all, &info);
    verdict = coordinator::Admit(options_.admission, all, info, waiting_);
  } else {  // the queue bound needs no view of the workers
    verdict = coordinator::Admit(options_.admission, {}, request, waiting_);
  }
  if (verdict.status.ok()) {
    ++waiting_;
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
    if (!IsTerminal(t.to)) continue;
    std::shared_ptr<CallHandle> call;
    {
      absl::MutexLock lock(&mu_);
      auto it = calls_.find(t.request_id);
      if (it != calls_.end()) call = it->second;
    }
    if (call != nullptr) call->Abort(t.request_id, t.status);
  }
}

void Cluster::Sweep() {
  for (const DownEvent& down : registry_->Tick()) {
    Log(absl::StrCat("worker ", WorkerRefString(down.worker),
                     " is down: ", down.reason));
    Apply(requests_.OnWorkerDown(down.worker));
  }
  const absl::Time now = clock_->Now();
  Apply(requests_.ExpireDeadlines(now));
  std::vector<std::string> stuck;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, since] : transferring_since_) {
      if (now - since > options_.transfer_timeout) stuck.push_back(id);
    }
    for (const std::string& id : stuck) transferring_since_.erase(id);
  }
  for (const std::string& id : stuck) {
    absl::StatusOr<Transition> t = requests_.OnTransferTimeout(id);
    if (t.ok()) Apply({*t});
  }
}

}  // namespace baton::coordinator
