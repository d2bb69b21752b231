#include "bench/sim/simulator.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <optional>
#include <queue>
#include <span>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "bench/sim/prefix_model.h"
#include "bench/sim/shared_hosts.h"
#include "bench/sim/sim_state.h"
#include "bench/sim/step_queue.h"
#include "common/check.h"
#include "coordinator/routing_policy.h"
#include "worker/engine/prefill_rate.h"

namespace baton::sim {
namespace {

using coordinator::Candidates;
using coordinator::RequestInfo;
using coordinator::WorkerInfo;
using coordinator::WorkerRole;

constexpr char kModel[] = "sim";

class Simulation {
 public:
  Simulation(const SimOptions& options, const std::vector<SimRequest>& in,
             std::unique_ptr<coordinator::RoutingPolicy> policy)
      : options_(options),
        p_(options.profile),
        policy_(std::move(policy)),
        prefix_(std::make_unique<PrefixModel>(options.profile.block_size,
                                              options.piece_tokens)) {
    requests_.resize(in.size());
    result_.records.resize(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      requests_[i].in = in[i];
      bench::RequestRecord& rec = result_.records[i];
      rec.index = static_cast<int>(i);
      rec.request_id = absl::StrCat("sim-", i);
      rec.sent = true;
      rec.send_time_s = in[i].arrival_s;
      rec.input_len = rec.prompt_tokens = static_cast<int>(in[i].input_len);
      rec.expected_output_len = static_cast<int>(in[i].output_len);
      Push(in[i].arrival_s, EventType::kArrival, static_cast<int>(i));
    }
    AddWorkers(WorkerRole::kPrefill, options.prefill, "p", &prefill_pool_);
    AddWorkers(WorkerRole::kDecode, options.decode, "d", &decode_pool_);
    AddWorkers(WorkerRole::kBoth, options.both, "c", &both_pool_);
    all_ = prefill_pool_;
    all_.insert(all_.end(), decode_pool_.begin(), decode_pool_.end());
    all_.insert(all_.end(), both_pool_.begin(), both_pool_.end());
    hosts_ = std::make_unique<SharedHosts>(p_.neighbor_slowdown,
                                           static_cast<int>(workers_.size()),
                                           options.workers_per_host);
  }

  SimResult Run() {
    while (!events_.empty()) {
      const Event e = events_.top();
      events_.pop();
      now_ = e.t;
      ++result_.events;
      switch (e.type) {
        case EventType::kArrival:
          Arrive(e.index);
          break;
        case EventType::kStepDone:
          // A neighbour's step that started or ended since moved this end.
          if (hosts_->Current(e.index, e.version)) StepDone(e.index);
          break;
        case EventType::kKvLanded:
          KvLanded(e.index);
          break;
      }
    }
    result_.end_s = now_;
    result_.evicted_blocks = prefix_->evictions();
    prefix_.reset();
    for (size_t i = 0; i < requests_.size(); ++i) {
      std::vector<float>& gaps = requests_[i].itl_ms;
      result_.records[i].itl_ms.assign(gaps.begin(), gaps.end());
      std::vector<float>().swap(gaps);
    }
    return std::move(result_);
  }

 private:
  void AddWorkers(WorkerRole role, int count, const char* prefix,
                  Candidates* pool) {
    for (int i = 0; i < count; ++i) {
      WorkerInfo info;
      info.ref = {absl::StrCat(prefix, i), 1};
      info.registration.role = role;
      info.registration.address = info.ref.id;
      info.registration.model_id = kModel;
      info.registration.kv_layout.block_size = p_.block_size;
      info.registration.kv_blocks_total = p_.kv_blocks;
      info.load.kv_blocks_total = p_.kv_blocks;
      info.load.kv_blocks_free = p_.kv_blocks;
      by_id_[info.ref.id] = static_cast<int>(workers_.size());
      prefix_->AddWorker(info.ref.id, p_.kv_blocks);
      Worker& w = workers_.emplace_back(p_);
      w.role = role;
      w.free_blocks = p_.kv_blocks;
      w.pool = pool;
      w.pool_index = pool->size();
      pool->push_back(std::move(info));
    }
  }

  void Push(double t, EventType type, int index, int64_t version = 0) {
    events_.push(Event{t, next_seq_++, type, index, version});
  }

  void PushEnds() {
    for (const SharedHosts::End& end : ends_) {
      Push(end.t, EventType::kStepDone, end.worker, end.version);
    }
    ends_.clear();
  }

  // The coordinator's view of worker `w` after a change.
  void Sync(int w) {
    Worker& worker = workers_[static_cast<size_t>(w)];
    coordinator::WorkerLoad& load = (*worker.pool)[worker.pool_index].load;
    load.queued_prefill_tokens = worker.queued_prefill_tokens;
    load.running_sequences = static_cast<int32_t>(
        worker.role == WorkerRole::kPrefill ? worker.queue.num_running()
                                            : worker.sequences);
    load.kv_blocks_free = worker.free_blocks;
    load.queued_reservations = static_cast<int32_t>(worker.line.size());
    load.prefill_tokens_per_second = worker.rate.tokens_per_second();
    // The admission view holds every worker.
    size_t offset = 0;
    if (worker.pool == &decode_pool_) offset = prefill_pool_.size();
    if (worker.pool == &both_pool_) {
      offset = prefill_pool_.size() + decode_pool_.size();
    }
    all_[offset + worker.pool_index].load = load;
  }

  int WorkerOf(const absl::StatusOr<coordinator::WorkerRef>& ref) const {
    return ref.ok() ? by_id_.at(ref->id) : -1;
  }

  RequestInfo Info(int r) const {
    RequestInfo info;
    info.model_id = kModel;
    info.prompt_tokens = requests_[static_cast<size_t>(r)].in.input_len;
    info.max_tokens = requests_[static_cast<size_t>(r)].in.output_len;
    return info;
  }

  // Info(r) with what the PrefixIndex knows of `pool`'s caches.
  RequestInfo RoutingInfo(int r, const Candidates& pool) const {
    RequestInfo info = Info(r);
    prefix_->Fill(requests_[static_cast<size_t>(r)].chain, pool, &info);
    return info;
  }

  void Fail(int r, absl::StatusCode code, const std::string& message) {
    bench::RequestRecord& rec = result_.records[static_cast<size_t>(r)];
    rec.success = false;
    rec.error_code = code;
    rec.error_message = message;
    rec.end_time_s = now_;
    rec.e2el_ms = 1e3 * (now_ - rec.send_time_s);
  }

  void Arrive(int r) {
    const RequestInfo info = Info(r);
    // As Cluster::Admit: the queue bound needs no view of the workers.
    static const Candidates kNone;
    const coordinator::AdmissionVerdict verdict = coordinator::Admit(
        options_.admission,
        options_.admission.ttft_slo > absl::ZeroDuration() ? all_ : kNone, info,
        waiting_);
    if (!verdict.status.ok()) {
      return Fail(r, verdict.status.code(),
                  std::string(verdict.status.message()));
    }
    ++waiting_;
    Request& req = requests_[static_cast<size_t>(r)];
    if (options_.prefix_cache) {
      req.chain = prefix_->Chain(req.in.piece_ids, req.in.input_len);
    }
    if (options_.prefill == 0) return SendToPrefill(r, &both_pool_);
    const RequestInfo routing = RoutingInfo(r, decode_pool_);
    const int decode = WorkerOf(policy_->PickDecode(decode_pool_, routing));
    if (decode >= 0) {
      // As Cluster::ClaimDecode: the picked worker prefills the prompt
      // itself when it holds all but a few of its tokens (nothing moves).
      if (coordinator::PrefillLocally(routing, all_name(decode),
                                      options_.local_prefill_tokens)) {
        return PrefillOnDecode(r, decode);
      }
      Reserve(r, decode);
      return SendToPrefill(r, &prefill_pool_);
    }
    const int line = WorkerOf(coordinator::PickDecodeQueue(decode_pool_, info));
    if (line < 0) {
      --waiting_;
      return Fail(r, absl::StatusCode::kResourceExhausted,
                  "no decode worker is big enough");
    }
    req.decode = line;
    workers_[static_cast<size_t>(line)].line.push_back(r);
    Sync(line);
  }

  // r's blocks and sequence count on decode worker `w` from now on.
  void Hold(int r, int w) {
    Request& req = requests_[static_cast<size_t>(r)];
    req.decode = w;
    req.blocks = coordinator::DecodeBlocksNeeded(Info(r), p_.block_size);
    Worker& worker = workers_[static_cast<size_t>(w)];
    worker.free_blocks -= req.blocks;
    ++worker.sequences;
    BATON_CHECK(worker.free_blocks >= 0);
  }

  void Reserve(int r, int w) {
    Hold(r, w);
    Request& req = requests_[static_cast<size_t>(r)];
    const Worker& worker = workers_[static_cast<size_t>(w)];
    // The transfer carries only the blocks this worker's cache lacks.
    const int64_t held =
        Shareable(r, prefix_->Use(w, req.chain, worker.free_blocks));
    req.transfer_tokens = req.in.input_len - held * p_.block_size;
    Sync(w);
  }

  // r goes colocated to decode worker `w`: its blocks are counted there
  // from now on (as StartPrefill's), and its prompt waits in w's queue.
  void PrefillOnDecode(int r, int w) {
    Hold(r, w);
    SendTo(r, w);
  }

  // Of `held` cached blocks of r's prompt, those a worker shares: the full
  // blocks before the one holding the last token, which the engine always
  // computes (Scheduler::Admit; a KV import pins the same).
  int64_t Shareable(int r, int64_t held) const {
    const int64_t len = requests_[static_cast<size_t>(r)].in.input_len;
    return std::min(held, (len - 1) / p_.block_size);
  }

  void SendToPrefill(int r, Candidates* pool) {
    const int w = WorkerOf(policy_->PickPrefill(*pool, RoutingInfo(r, *pool)));
    BATON_CHECK(w >= 0);
    if (workers_[static_cast<size_t>(w)].role == WorkerRole::kBoth) {
      ++workers_[static_cast<size_t>(w)].sequences;
    }
    SendTo(r, w);
  }

  // r's prompt joins worker w's queue.
  void SendTo(int r, int w) {
    Request& req = requests_[static_cast<size_t>(r)];
    req.prefill = w;
    Worker& worker = workers_[static_cast<size_t>(w)];
    worker.queue.AddWaiting(r, req.in.input_len);
    worker.queued_prefill_tokens += req.in.input_len;
    Sync(w);
    MaybeStep(w);
  }

  // Frees `r`'s blocks on its decode (or colocated) worker and serves the
  // worker's line in order while it has room.
  void Free(int r) {
    Request& req = requests_[static_cast<size_t>(r)];
    const int w = req.decode;
    Worker& worker = workers_[static_cast<size_t>(w)];
    worker.free_blocks += req.blocks;
    req.blocks = 0;
    --worker.sequences;
    // Its prompt blocks stay cached in the space it frees.
    prefix_->Store(w, req.chain, worker.free_blocks);
    req.chain.clear();
    req.chain.shrink_to_fit();
    while (!worker.line.empty()) {
      const int next = worker.line.front();
      if (coordinator::DecodeBlocksNeeded(Info(next), p_.block_size) >
          worker.free_blocks) {
        break;
      }
      worker.line.pop_front();
      Reserve(next, w);
      SendToPrefill(next, &prefill_pool_);
    }
    Sync(w);
  }

  void Token(int r) {
    Request& req = requests_[static_cast<size_t>(r)];
    bench::RequestRecord& rec = result_.records[static_cast<size_t>(r)];
    ++req.generated;
    ++rec.output_tokens;
    if (req.generated == 1) {
      rec.ttft_ms = 1e3 * (now_ - req.in.arrival_s);
      // Exactly one gap per later token, no room left over from regrowth.
      req.itl_ms.reserve(
          static_cast<size_t>(std::max<int64_t>(0, req.in.output_len - 1)));
      --waiting_;
    } else {
      req.itl_ms.push_back(static_cast<float>(1e3 * (now_ - req.last_token)));
    }
    req.last_token = now_;
  }

  void Finish(int r) {
    bench::RequestRecord& rec = result_.records[static_cast<size_t>(r)];
    rec.success = true;
    rec.finish_reason = "length";
    rec.end_time_s = now_;
    rec.e2el_ms = 1e3 * (now_ - rec.send_time_s);
    const Request& req = requests_[static_cast<size_t>(r)];
    rec.prefill_worker = all_name(req.prefill);
    rec.decode_worker = all_name(req.decode);
    Free(r);
  }

  std::string all_name(int w) const {
    const Worker& worker = workers_[static_cast<size_t>(w)];
    return (*worker.pool)[worker.pool_index].ref.id;
  }

  bool Done(int r) const {
    const Request& req = requests_[static_cast<size_t>(r)];
    return req.generated >= req.in.output_len;
  }

  void MaybeStep(int w) {
    Worker& worker = workers_[static_cast<size_t>(w)];
    if (worker.busy) return;
    // As the engine: running sequences first (decodes, prompts' next
    // chunks), then waiting prompts, under the step's token budget;
    // colocated prompts start only once their blocks fit.
    worker.queue.Schedule([&](int r) { return Admit(w, r); }, &worker.in_step);
    if (worker.in_step.empty()) return;
    StepWork work;
    for (const StepQueue::Item& item : worker.in_step) {
      Request& req = requests_[static_cast<size_t>(item.r)];
      if (item.decode) {
        // Feeds the last token sampled: the context holds it after.
        work.Add(req.in.input_len + req.generated - 1, 1);
        continue;
      }
      work.Add(item.start, item.tokens);
      if (item.samples) req.prefill_start = now_;
    }
    const double prefill_s = work.PrefillPart(p_);
    const double decode_s = work.DecodePart(p_);
    worker.busy = true;
    worker.step_start = now_;
    // Its end, and those of its host's other steps, which it slows down.
    hosts_->Start(w, now_, prefill_s, decode_s, &ends_);
    PushEnds();
    Sync(w);
  }

  // A waiting prompt of worker `w` starts: the tokens its cache holds, or
  // nullopt while a colocated one's blocks do not fit.
  std::optional<int64_t> Admit(int w, int r) {
    Worker& worker = workers_[static_cast<size_t>(w)];
    Request& req = requests_[static_cast<size_t>(r)];
    if (worker.role == WorkerRole::kBoth) {
      const int64_t need =
          coordinator::DecodeBlocksNeeded(Info(r), p_.block_size);
      if (need > worker.free_blocks) return std::nullopt;
      req.decode = w;
      req.blocks = need;
      worker.free_blocks -= need;
    }
    // Computed on top of the cached prefix (in the room a decode or
    // colocated worker has besides its requests' blocks).
    const int64_t capacity =
        worker.role == WorkerRole::kPrefill ? p_.kv_blocks : worker.free_blocks;
    const int64_t cached =
        Shareable(r, prefix_->Use(w, req.chain, capacity)) * p_.block_size;
    result_.records[static_cast<size_t>(r)].cached_tokens =
        static_cast<int>(cached);
    result_.prompt_tokens += req.in.input_len;
    result_.cached_tokens += cached;
    return cached;
  }

  void StepDone(int w) {
    Worker& worker = workers_[static_cast<size_t>(w)];
    hosts_->Finish(w, now_, &ends_);
    PushEnds();
    // Still busy while its tokens are handed out: a request this frees room
    // for starts with the next step. (MaybeStep refills the items.)
    std::vector<StepQueue::Item>& items = worker.in_step;
    worker.queue.Advance(items);
    int64_t prompt_tokens = 0;
    for (const StepQueue::Item& item : items) {
      const int r = item.r;
      Request& req = requests_[static_cast<size_t>(r)];
      if (!item.decode) {
        prompt_tokens += item.tokens;
        // A prefill worker publishes a prompt's full blocks after each of
        // its chunks, as the engine does; a colocated one (or a decode
        // worker prefilling locally) holds them for the request and caches
        // them when it ends (Free).
        if (worker.role == WorkerRole::kPrefill) {
          const auto full = std::min(
              req.chain.size(),
              static_cast<size_t>((item.start + item.tokens) / p_.block_size));
          prefix_->Store(w, std::span(req.chain).first(full), p_.kv_blocks);
        }
      }
      if (!item.samples) continue;
      if (!item.decode) worker.queued_prefill_tokens -= req.in.input_len;
      Token(r);
      if (Done(r)) {
        worker.queue.Remove(r);
        Finish(r);
      } else if (worker.role == WorkerRole::kPrefill) {
        worker.queue.Remove(r);
        // The transfer overlaps the prompt's last step layer by layer.
        Push(std::max(now_, req.prefill_start +
                                TransferSeconds(p_, req.transfer_tokens)),
             EventType::kKvLanded, r);
      }
    }
    worker.rate.Record(prompt_tokens, now_ - worker.step_start);
    worker.busy = false;
    Sync(w);
    MaybeStep(w);
  }

  void KvLanded(int r) {
    const Request& req = requests_[static_cast<size_t>(r)];
    workers_[static_cast<size_t>(req.decode)].queue.AddRunning(
        r, req.in.input_len);
    MaybeStep(req.decode);
  }

  const SimOptions& options_;
  const WorkerProfile& p_;
  std::unique_ptr<coordinator::RoutingPolicy> policy_;
  std::unique_ptr<PrefixModel> prefix_;
  std::unique_ptr<SharedHosts> hosts_;
  std::vector<SharedHosts::End> ends_;  // scratch
  std::vector<Request> requests_;
  std::deque<Worker> workers_;  // PrefillRate does not move
  absl::flat_hash_map<std::string, int> by_id_;
  Candidates prefill_pool_, decode_pool_, both_pool_, all_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  int64_t next_seq_ = 0;
  int64_t waiting_ = 0;  // admitted, before the first token
  double now_ = 0;
  SimResult result_;
};

}  // namespace

absl::StatusOr<SimResult> Simulate(const SimOptions& options,
                                   const std::vector<SimRequest>& requests) {
  if (absl::Status s = ValidateSimInput(options, requests); !s.ok()) return s;
  std::unique_ptr<coordinator::RoutingPolicy> policy;
  if (options.policy == "least_loaded") {
    policy = coordinator::NewLeastLoadedPolicy();
  } else if (options.policy == "round_robin") {
    policy = coordinator::NewRoundRobinPolicy();
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "policy '", options.policy, "': least_loaded or round_robin"));
  }
  return Simulation(options, requests, std::move(policy)).Run();
}

}  // namespace baton::sim
