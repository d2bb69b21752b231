#include "worker/engine/engine.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
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
  BATON_ASSIGN_OR_RETURN(engine->cache_, KvCache::Create(kv));
  BATON_ASSIGN_OR_RETURN(
      engine->runner_,
      ModelRunner::Create(weights, engine->cache_.get(), engine->pool_.get()));
  if (options.scheduler.max_num_seqs < 1 ||
      options.scheduler.max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError(
        "max_num_seqs and max_num_batched_tokens must be >= 1");
  }
  engine->scheduler_ =
      std::make_unique<Scheduler>(options.scheduler, engine->cache_.get());
  engine->eos_ids_ = tokenizer->end_of_generation_ids();
  return engine;
}

Engine::~Engine() {
  for (auto& [id, seq] : live_) cache_->Free(seq->table);
}

absl::Status Engine::Submit(GenerationRequest request,
                            OutputCallback on_output) {
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
  const int64_t max_total =
      static_cast<int64_t>(request.prompt.size()) + request.params.max_tokens;
  if (cache_->BlocksNeeded(max_total) > cache_->num_blocks_total()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "prompt (", request.prompt.size(), " tokens) + max_tokens (",
        request.params.max_tokens, ") needs ", cache_->BlocksNeeded(max_total),
        " KV blocks, but the pool has only ", cache_->num_blocks_total()));
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
  seq->on_output = std::move(on_output);
  seq->request = std::move(request);
  absl::MutexLock lock(&inbox_mu_);
  if (!ids_.emplace(seq->request.id, true).second) {
    return absl::InvalidArgumentError(
        absl::StrCat("request id '", seq->request.id, "' is already in use"));
  }
  seq->arrival_order = next_arrival_++;
  inbox_.push_back(std::move(seq));
  return absl::OkStatus();
}

void Engine::Cancel(const std::string& request_id) {
  absl::MutexLock lock(&inbox_mu_);
  cancels_.push_back(request_id);
}

bool Engine::HasWork() {
  {
    absl::MutexLock lock(&inbox_mu_);
    if (!inbox_.empty() || !cancels_.empty()) return true;
  }
  return scheduler_->HasWork();
}

EngineStats Engine::stats() {
  EngineStats s;
  s.num_waiting = scheduler_->num_waiting();
  s.num_running = scheduler_->num_running();
  s.kv_blocks_total = cache_->num_blocks_total();
  s.kv_blocks_free = cache_->num_blocks_free();
  return s;
}

void Engine::DrainInbox() {
  std::vector<std::unique_ptr<Sequence>> arrived;
  std::vector<std::string> cancels;
  {
    absl::MutexLock lock(&inbox_mu_);
    arrived.swap(inbox_);
    cancels.swap(cancels_);
  }
  for (auto& seq : arrived) {
    Sequence* raw = seq.get();
    live_.emplace(raw->request.id, std::move(seq));
    scheduler_->AddWaiting(raw);
  }
  for (const std::string& id : cancels) {
    auto it = live_.find(id);
    if (it == live_.end()) continue;
    scheduler_->Remove(it->second.get());
    Finish(it->second.get(), FinishReason::kCancelled, RequestOutput{});
  }
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
    scheduler_->Remove(seq);
    Finish(seq, FinishReason::kError, RequestOutput{}, sample.status());
    return true;
  }
  const int32_t token = sample->token;
  seq->sampler->Accept(token);
  seq->tokens.push_back(token);
  if (seq->num_generated() == 1) seq->metrics.first_token = Clock::now();

  RequestOutput out;
  out.tokens.push_back(TokenOutput{token, sample->logprob,
                                   std::move(sample->top_logprobs),
                                   std::move(sample->processed)});
  const SamplingParams& params = seq->request.params;
  FinishReason reason = FinishReason::kNone;
  if (IsStopToken(params, token, eos_ids_)) {
    reason = FinishReason::kStop;
  } else {
    StopChecker::Result r =
        seq->stop_checker->Push(seq->detokenizer->Push(token));
    out.text = std::move(r.emit);
    if (r.stopped) reason = FinishReason::kStop;
  }
  if (reason == FinishReason::kNone &&
      seq->num_generated() >= params.max_tokens) {
    reason = FinishReason::kLength;
  }
  if (reason == FinishReason::kNone) {
    seq->on_output(out);
    return false;
  }
  if (!seq->stop_checker->stopped()) {
    // Flush a held-back partial character and held-back stop-string prefix.
    StopChecker::Result r = seq->stop_checker->Push(seq->detokenizer->Finish());
    out.text += r.emit;
    if (r.stopped) {
      reason = FinishReason::kStop;
    } else {
      out.text += seq->stop_checker->Finish();
    }
  }
  scheduler_->Remove(seq);
  Finish(seq, reason, std::move(out));
  return true;
}

bool Engine::Step() {
  DrainInbox();
  std::vector<Sequence*> preempted;
  std::vector<ScheduledItem> scheduled = scheduler_->Schedule(&preempted);
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
  absl::Status status = runner_->Forward(items, &logits_);
  if (!status.ok()) {
    for (const ScheduledItem& s : scheduled) {
      scheduler_->Remove(s.seq);
      Finish(s.seq, FinishReason::kError, RequestOutput{}, status);
    }
    return true;
  }
  const int64_t vocab = config().vocab_size;
  int64_t row = 0;
  for (const ScheduledItem& s : scheduled) {
    s.seq->num_cached += s.num_tokens;
    if (!s.samples) continue;
    PostProcess(s.seq,
                std::span<const float>(logits_).subspan(row * vocab, vocab));
    ++row;
  }
  return true;
}

void Engine::RunUntilIdle() {
  while (HasWork()) Step();
}

}  // namespace baton
