#include "worker/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/fault/fault_points.h"
#include "common/status_macros.h"

namespace baton {

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(
    const EngineOptions& options, const ModelWeights* weights,
    const Tokenizer* tokenizer) {
  std::unique_ptr<Engine> engine(new Engine(options, weights, tokenizer));
  const ModelConfig& c = weights->config();
  if (tokenizer->vocab_size() > c.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer has ", tokenizer->vocab_size(),
                     " tokens but the model's vocabulary is ", c.vocab_size));
  }
  ThreadPoolOptions pool_options;
  pool_options.num_threads = options.num_threads;
  BATON_ASSIGN_OR_RETURN(engine->pool_, ThreadPool::Create(pool_options));
  KvCacheOptions kv;
  kv.num_layers = c.num_layers;
  kv.num_kv_heads = c.num_kv_heads;
  kv.head_dim = c.head_dim;
  kv.block_size = options.block_size;
  if (options.kv_cache_blocks > 0) {
    kv.num_blocks = options.kv_cache_blocks;
  } else {
    kv.max_bytes = options.kv_cache_bytes;
  }
  kv.prefault = options.kv_prefault;
  BATON_ASSIGN_OR_RETURN(engine->cache_, KvCache::Create(kv));
  if (options.make_runner) {
    BATON_ASSIGN_OR_RETURN(engine->runner_,
                           options.make_runner(weights, engine->cache_.get(),
                                               engine->pool_.get()));
    if (engine->runner_ == nullptr) {
      return absl::InternalError("make_runner returned no runner");
    }
  } else {
    BATON_ASSIGN_OR_RETURN(engine->runner_,
                           ModelRunner::Create(weights, engine->cache_.get(),
                                               engine->pool_.get()));
  }
  if (engine->runner_->device_kv_pool() != nullptr) {
    engine->staging_ = std::make_unique<KvStagingPool>(
        engine->runner_->host_staging(), engine->cache_->layout());
    // The pool's bytes live on the device alone: unmap the host mapping
    // (never touched, so never committed).
    if (!engine->runner_->reads_host_kv()) engine->cache_->DropHostStorage();
  }
  if (options.scheduler.max_num_seqs < 1 ||
      options.scheduler.max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError(
        "max_num_seqs and max_num_batched_tokens must be >= 1");
  }
  engine->prefix_root_ = PrefixRootHash(
      absl::StrCat(options.model_id, "|", engine->cache_->layout().ToString()));
  engine->scheduler_ = std::make_unique<Scheduler>(
      options.scheduler, engine->cache_.get(),
      PrefixCacheConfig{.enabled = options.prefix_cache,
                        .root = engine->prefix_root_});
  engine->eos_ids_ = tokenizer->end_of_generation_ids();
  return engine;
}

absl::Status Engine::health() const {
  absl::Status status = runner_->health();
  if (status.ok()) return status;
  return absl::UnavailableError(
      absl::StrCat("worker unhealthy: the ", runner_->device_name(),
                   " runner failed (", status.ToString(), ")"));
}

Engine::~Engine() {
  // Stop every sender thread before its blocks go away.
  handing_off_.clear();
  for (auto& [id, seq] : live_) seq->handoff.reset();
  detached_.clear();
  absl::MutexLock lock(&cache_mu_);
  for (auto& [id, seq] : live_) cache_->Free(seq->table);
  for (auto& [id, slot] : imports_) cache_->Free(slot->table);
}

absl::StatusOr<std::unique_ptr<Sequence>> Engine::NewSequence(
    GenerationRequest request, int64_t pool_tokens) {
  BATON_RETURN_IF_ERROR(health());
  const ModelConfig& c = config();
  BATON_RETURN_IF_ERROR(Validate(request.params,
                                 static_cast<int64_t>(request.prompt.size()),
                                 c.context_length));
  for (int32_t token : request.prompt) {
    if (token < 0 || token >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt token id ", token, " is outside [0, ", c.vocab_size, ")"));
    }
  }
  if (cache_->BlocksNeeded(pool_tokens) > cache_->num_blocks_total()) {
    // Never fits here (not a full pool: retrying cannot help).
    return absl::FailedPreconditionError(absl::StrCat(
        "prompt (", request.prompt.size(), " tokens) + max_tokens (",
        request.params.max_tokens, ") needs ",
        cache_->BlocksNeeded(pool_tokens), " KV blocks, but the pool has only ",
        cache_->num_blocks_total()));
  }
  auto seq = std::make_unique<Sequence>();
  BATON_ASSIGN_OR_RETURN(
      seq->sampler, RequestSampler::Create(request.params, request.prompt));
  seq->detokenizer =
      std::make_unique<IncrementalDecoder>(*tokenizer_,
                                           /*skip_special=*/true);
  seq->stop_checker = std::make_unique<StopChecker>(request.params.stop);
  seq->tokens = request.prompt;
  seq->num_prompt = static_cast<int64_t>(request.prompt.size());
  seq->metrics.prompt_tokens = seq->num_prompt;
  seq->metrics.arrival = Clock::now();
  seq->request = std::move(request);
  return seq;
}

absl::Status Engine::Enqueue(std::unique_ptr<Sequence> seq, bool id_reserved) {
  absl::MutexLock lock(&inbox_mu_);
  if (!id_reserved && !ids_.emplace(seq->request.id, true).second) {
    return absl::InvalidArgumentError(
        absl::StrCat("request id '", seq->request.id, "' is already in use"));
  }
  seq->arrival_order = next_arrival_++;
  seq->arrival_us = FcfsArrivalNow(seq->request.arrival_unix_us);
  inbox_.push_back(std::move(seq));
  return absl::OkStatus();
}

absl::Status Engine::Submit(GenerationRequest request,
                            OutputCallback on_output) {
  const int64_t max_total =
      static_cast<int64_t>(request.prompt.size()) + request.params.max_tokens;
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<Sequence> seq,
                         NewSequence(std::move(request), max_total));
  seq->on_output = std::move(on_output);
  return Enqueue(std::move(seq), /*id_reserved=*/false);
}

void Engine::Cancel(const std::string& request_id) {
  if (CancelImport(request_id)) return;
  absl::MutexLock lock(&inbox_mu_);
  cancels_.push_back(request_id);
}

bool Engine::HasWork() {
  {
    absl::MutexLock lock(&inbox_mu_);
    if (!inbox_.empty() || !cancels_.empty() || !handoffs_done_.empty()) {
      return true;
    }
  }
  return scheduler_->HasWork() || !handing_off_.empty();
}

void Engine::RemoveFromScheduler(Sequence* seq) {
  absl::MutexLock lock(&cache_mu_);
  scheduler_->Remove(seq);
}

void Engine::EndEarly(Sequence* seq, FinishReason reason, absl::Status status) {
  if (seq->handoff != nullptr) {
    seq->handoff->Abort(std::move(status));
    absl::MutexLock lock(&cache_mu_);
    scheduler_->Detach(seq);
    return;
  }
  RemoveFromScheduler(seq);
  if (seq->prefill_only()) {
    FinishPrefill(seq, std::move(status), KvHandoffMetrics{});
    return;
  }
  Finish(seq, reason, RequestOutput{},
         reason == FinishReason::kError ? std::move(status) : absl::OkStatus());
}

void Engine::DrainInbox() {
  std::vector<std::unique_ptr<Sequence>> arrived;
  std::vector<std::string> cancels;
  std::vector<uint64_t> completed;
  {
    absl::MutexLock lock(&inbox_mu_);
    arrived.swap(inbox_);
    cancels.swap(cancels_);
    completed.swap(handoffs_done_);
  }
  for (auto& seq : arrived) Adopt(std::move(seq));
  for (const std::string& id : cancels) CancelLive(id);
  ProcessHandoffs(completed);
}

void Engine::Adopt(std::unique_ptr<Sequence> seq) {
  Sequence* raw = seq.get();
  live_.emplace(raw->request.id, std::move(seq));
  if (!raw->initial_output.has_value()) {
    scheduler_->AddWaiting(raw);
    return;
  }
  RequestOutput out = std::move(*raw->initial_output);
  raw->initial_output.reset();
  if (out.finish_reason == FinishReason::kNone) {
    {
      absl::MutexLock lock(&cache_mu_);
      scheduler_->AddRunning(raw);
    }
    // An import staged on the host: the device runner copies it in, and
    // the staging blocks go back at once.
    absl::Status s;
    if (raw->staged_import != nullptr) {
      s = runner_->CopyToDevice(
          KvStagingCopy{.table = &raw->table,
                        .first_block = raw->import_first_block,
                        .host = &raw->staged_import->cache(),
                        .staged = &raw->staged_import->table()});
      raw->staged_import.reset();
    }
    if (!s.ok()) {
      EndEarly(
          raw, FinishReason::kError,
          absl::Status(s.code(), absl::StrCat("copying the imported KV to the ",
                                              runner_->device_name(), ": ",
                                              s.message())));
      return;
    }
    if (!out.text.empty()) raw->on_output(out);
    return;
  }
  const FinishReason reason = out.finish_reason;
  RemoveFromScheduler(raw);  // frees the imported blocks
  Finish(raw, reason, std::move(out));
}

void Engine::CancelLive(const std::string& request_id) {
  auto it = live_.find(request_id);
  if (it == live_.end()) return;
  EndEarly(it->second.get(), FinishReason::kCancelled,
           absl::CancelledError(
               absl::StrCat("request '", request_id, "' was cancelled")));
}

void Engine::WaitForEvents() {
  absl::MutexLock lock(&inbox_mu_);
  auto pending = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(inbox_mu_) {
    return !inbox_.empty() || !cancels_.empty() || !handoffs_done_.empty();
  };
  inbox_mu_.AwaitWithTimeout(absl::Condition(&pending), absl::Milliseconds(5));
}

void Engine::Finish(Sequence* seq, FinishReason reason, RequestOutput output,
                    absl::Status error) {
  seq->metrics.finished = Clock::now();
  seq->metrics.generated_tokens = seq->num_generated();
  output.request_id = seq->request.id;
  output.finish_reason = reason;
  output.error = std::move(error);
  output.metrics = seq->metrics;
  std::string id = seq->request.id;
  OutputCallback callback = std::move(seq->on_output);
  live_.erase(id);  // destroys seq
  {
    absl::MutexLock lock(&inbox_mu_);
    ids_.erase(id);
  }
  if (callback) callback(output);
}

bool Engine::PostProcess(Sequence* seq, std::span<const float> logits) {
  absl::StatusOr<SampleResult> sample = seq->sampler->Sample(logits);
  if (!sample.ok()) {
    EndEarly(seq, FinishReason::kError, sample.status());
    return true;
  }
  const int32_t token = sample->token;
  seq->sampler->Accept(token);
  seq->tokens.push_back(token);
  if (seq->num_generated() == 1) seq->metrics.first_token = Clock::now();
  TokenOutput token_output{token, sample->logprob,
                           std::move(sample->top_logprobs),
                           std::move(sample->processed)};

  if (seq->prefill_only()) {
    // The decode side detokenizes; this side only hands the token over.
    {
      absl::MutexLock lock(&cache_mu_);
      scheduler_->Detach(seq);  // blocks stay until the handoff ends
    }
    PrefillOutput out;
    out.request_id = seq->request.id;
    out.first_token = std::move(token_output);
    out.seed = seq->sampler->seed();
    out.metrics.cached_tokens = seq->metrics.cached_tokens;
    seq->on_prefill(out);
    return true;
  }

  RequestOutput out;
  out.tokens.push_back(std::move(token_output));
  out.metrics.cached_tokens = seq->metrics.cached_tokens;
  FinishReason reason = AdvanceText(seq, token, &out);
  if (reason == FinishReason::kNone) {
    seq->on_output(out);
    return false;
  }
  FlushText(seq, &reason, &out);
  RemoveFromScheduler(seq);
  Finish(seq, reason, std::move(out));
  return true;
}

bool Engine::Step() {
  const bool worked = StepOnce();
  if (worked) published_steps_.fetch_add(1, std::memory_order_relaxed);
  // Scheduler state belongs to this thread; other threads read the copy.
  published_waiting_.store(scheduler_->num_waiting(),
                           std::memory_order_relaxed);
  published_running_.store(scheduler_->num_running(),
                           std::memory_order_relaxed);
  published_handoffs_.store(static_cast<int64_t>(handing_off_.size()),
                            std::memory_order_relaxed);
  published_prefix_queries_.store(scheduler_->prefix_query_tokens(),
                                  std::memory_order_relaxed);
  published_prefix_hits_.store(scheduler_->prefix_hit_tokens(),
                               std::memory_order_relaxed);
  return worked;
}

bool Engine::StepOnce() {
  DrainInbox();
  std::vector<Sequence*> preempted;
  std::vector<ScheduledItem> scheduled;
  {
    absl::MutexLock lock(&cache_mu_);
    scheduled = scheduler_->Schedule(&preempted);
  }
  if (scheduled.empty()) return false;

  std::vector<ForwardItem> items;
  items.reserve(scheduled.size());
  const Clock::time_point now = Clock::now();
  for (const ScheduledItem& s : scheduled) {
    Sequence* seq = s.seq;
    if (seq->metrics.first_scheduled == Clock::time_point{}) {
      seq->metrics.first_scheduled = now;
    }
    items.push_back(
        ForwardItem{&seq->table, seq->num_cached,
                    std::span<const int32_t>(seq->tokens)
                        .subspan(seq->num_cached, s.num_tokens),
                    s.samples ? LogitsMode::kLast : LogitsMode::kNone});
  }
  // Prompts whose last chunk runs now stream each layer as it completes.
  // A device runner first copies each finished layer of those sent over a
  // host transport to their staging blocks, which the senders read; after a
  // failed copy no further layer is released and the step fails.
  std::vector<KvHandoff*> streaming;
  std::vector<KvStagingCopy> streaming_copies;
  std::vector<uint64_t> streaming_serials;
  // Handoffs of earlier steps still waiting for their confirmation.
  const bool confirming = !handing_off_.empty();
  for (const ScheduledItem& s : scheduled) {
    if (s.samples && s.seq->prefill_only() && s.seq->handoff == nullptr) {
      StartHandoff(s.seq);
      streaming.push_back(s.seq->handoff.get());
      streaming_serials.push_back(s.seq->handoff_serial);
      if (const StagedKv* staged = s.seq->staged_handoff.get()) {
        streaming_copies.push_back(
            KvStagingCopy{.table = &s.seq->table,
                          .first_block = s.seq->handoff_first_block,
                          .host = &staged->cache(),
                          .staged = &staged->table()});
      }
    }
  }
  absl::Status staging;
  LayerDoneFn on_layer = nullptr;
  if (!streaming.empty() || confirming) {
    on_layer = [this, &streaming, &streaming_copies, &streaming_serials,
                &staging, confirming](int64_t layer) {
      if (confirming) FinishHandoffsMidStep(streaming_serials);
      if (!staging.ok()) return;
      if (!streaming_copies.empty()) {
        staging = runner_->CopyLayerToHost(layer, streaming_copies);
        if (!staging.ok()) return;
      }
      for (KvHandoff* h : streaming) h->LayerReady(layer);
    };
  }
  absl::Status status = HitStepFaultPoints(scheduled);
  const Clock::time_point forward_start = Clock::now();
  if (status.ok()) status = runner_->Forward(items, &logits_, on_layer);
  if (status.ok()) {
    int64_t prompt_tokens = 0;
    for (const ScheduledItem& s : scheduled) {
      prompt_tokens += std::clamp<int64_t>(
          s.seq->num_prompt - s.seq->num_cached, 0, s.num_tokens);
    }
    prefill_rate_.Record(
        prompt_tokens,
        std::chrono::duration<double>(Clock::now() - forward_start).count());
  }
  if (status.ok() && !staging.ok()) {
    status = absl::Status(staging.code(),
                          absl::StrCat("copying the KV to the host for its "
                                       "handoff: ",
                                       staging.message()));
  }
  if (!status.ok()) {
    for (const ScheduledItem& s : scheduled) {
      EndEarly(s.seq, FinishReason::kError, status);
    }
    return true;
  }
  const int64_t vocab = config().vocab_size;
  int64_t row = 0;
  for (const ScheduledItem& s : scheduled) s.seq->num_cached += s.num_tokens;
  if (options_.prefix_cache) PublishFullBlocks(scheduled);
  for (const ScheduledItem& s : scheduled) {
    if (!s.samples) continue;
    PostProcess(s.seq,
                std::span<const float>(logits_).subspan(row * vocab, vocab));
    ++row;
  }
  return true;
}

absl::Status Engine::HitStepFaultPoints(
    const std::vector<ScheduledItem>& scheduled) {
  FaultPoints& faults = FaultPoints::Global();
  if (!faults.armed()) return absl::OkStatus();
  bool prefills = false;
  bool decodes = false;
  for (const ScheduledItem& s : scheduled) {
    (s.seq->num_cached < s.seq->num_prompt ? prefills : decodes) = true;
  }
  if (prefills) BATON_RETURN_IF_ERROR(faults.Hit(kFaultPrefillStep));
  if (decodes) BATON_RETURN_IF_ERROR(faults.Hit(kFaultDecodeStep));
  return absl::OkStatus();
}

void Engine::Shutdown(const absl::Status& reason) {
  DrainInbox();
  std::vector<Sequence*> ending;
  for (auto& [id, seq] : live_) ending.push_back(seq.get());
  for (Sequence* seq : ending) {
    if (seq->handoff != nullptr) {
      // Joins the sender thread (aborted: it stops at its next chunk), so
      // the blocks it reads can go.
      handing_off_.erase(seq->handoff_serial);
      seq->handoff->Abort(reason);
      seq->handoff.reset();
      RemoveFromScheduler(seq);
      FinishPrefill(seq, reason, KvHandoffMetrics{});
      continue;
    }
    EndEarly(seq, FinishReason::kError, reason);
  }
}

void Engine::RunUntilIdle() {
  while (HasWork()) {
    if (!Step()) WaitForEvents();
  }
}

}  // namespace baton
