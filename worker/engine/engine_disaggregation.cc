// Engine entry points for prefill/decode disaggregation: prefill-only
// requests that hand their KV cache to a KvSink, and imported requests that
// continue decoding from a KV cache another engine computed.
#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/fault/fault_points.h"
#include "common/status_macros.h"
#include "worker/engine/engine.h"

namespace baton {

// --- Prefill side ---

absl::Status Engine::SubmitPrefill(GenerationRequest request,
                                   PrefillOptions options,
                                   PrefillCallback on_output) {
  if (!options.make_sink) {
    return absl::InvalidArgumentError("PrefillOptions.make_sink is required");
  }
  if (!on_output) {
    return absl::InvalidArgumentError("SubmitPrefill needs an output callback");
  }
  const int64_t prompt = static_cast<int64_t>(request.prompt.size());
  if (options.first_block < 0 || options.first_block * cache_->block_size() >=
                                     std::max<int64_t>(1, prompt)) {
    return absl::InvalidArgumentError(
        absl::StrCat("first_block ", options.first_block, " must be in [0, ",
                     cache_->BlocksNeeded(prompt), ") for a prompt of ", prompt,
                     " tokens (the block of the last token always travels)"));
  }
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<Sequence> seq,
                         NewSequence(std::move(request), prompt));
  seq->handoff_first_block = options.first_block;
  seq->on_prefill = std::move(on_output);
  seq->make_sink = std::move(options.make_sink);
  seq->handoff_timeout = options.timeout;
  seq->sink_reads_device_pool = options.sink_reads_device_pool;
  return Enqueue(std::move(seq), /*id_reserved=*/false);
}

void Engine::StartHandoff(Sequence* seq) {
  KvSinkInfo info;
  info.request_id = seq->request.id;
  info.layout = cache_->layout();
  info.num_tokens = seq->num_prompt;
  info.first_block = seq->handoff_first_block;
  const auto ids =
      seq->table.block_ids()
          .first(static_cast<size_t>(cache_->BlocksNeeded(seq->num_prompt)))
          .subspan(static_cast<size_t>(info.first_block));
  std::vector<int32_t> block_ids(ids.begin(), ids.end());
  KvSinkFactory make_sink = std::move(seq->make_sink);
  KvPoolAddress pool;
  if (device_kv_pool() == nullptr) {
    pool = KvPoolAddress::Host(*cache_);
  } else if (seq->sink_reads_device_pool) {
    pool = KvPoolAddress::Device(*cache_, device_kv_pool());
  } else {
    // A host transport from a device pool: the step copies each layer of
    // the carried blocks to a staging area as it completes.
    absl::StatusOr<std::unique_ptr<StagedKv>> staged =
        staging_->Acquire(static_cast<int64_t>(block_ids.size()));
    if (staged.ok()) {
      seq->staged_handoff = std::move(*staged);
      pool = KvPoolAddress::Host(seq->staged_handoff->cache());
      const auto staged_ids = seq->staged_handoff->table().block_ids();
      block_ids.assign(staged_ids.begin(), staged_ids.end());
    } else {
      // The handoff fails with the reason as its sink opens.
      make_sink =
          [error = staged.status()](
              const KvSinkInfo&) -> absl::StatusOr<std::unique_ptr<KvSink>> {
        return PrefixStatus("staging the KV on the host for its handoff: ",
                            error);
      };
    }
  }
  const uint64_t serial = next_handoff_serial_++;
  seq->handoff_serial = serial;
  seq->handoff_deadline = Clock::now() + seq->handoff_timeout;
  seq->handoff =
      std::make_unique<KvHandoff>(pool, std::move(info), std::move(block_ids),
                                  std::move(make_sink), [this, serial] {
                                    absl::MutexLock lock(&inbox_mu_);
                                    handoffs_done_.push_back(serial);
                                    if (wakeup_) wakeup_();
                                  });
  handing_off_.emplace(serial, seq);
}

void Engine::SetWakeup(std::function<void()> wake) {
  absl::MutexLock lock(&inbox_mu_);
  wakeup_ = std::move(wake);
}

void Engine::FinishHandoffsMidStep(const std::vector<uint64_t>& in_step) {
  std::vector<uint64_t> completed;
  {
    absl::MutexLock lock(&inbox_mu_);
    if (handoffs_done_.empty()) return;
    std::vector<uint64_t> later;
    for (uint64_t serial : handoffs_done_) {
      (std::find(in_step.begin(), in_step.end(), serial) == in_step.end()
           ? completed
           : later)
          .push_back(serial);
    }
    handoffs_done_.swap(later);
  }
  // Their sequences are detached from the scheduler and in no batch: the
  // step being computed reads none of their blocks.
  FinishCompletedHandoffs(completed);
}

void Engine::FinishCompletedHandoffs(const std::vector<uint64_t>& completed) {
  for (uint64_t serial : completed) {
    auto it = handing_off_.find(serial);
    if (it == handing_off_.end()) continue;  // timed out earlier
    Sequence* seq = it->second;
    handing_off_.erase(it);
    const KvHandoffResult result = seq->handoff->result();
    seq->handoff.reset();  // joins the finished sender thread
    RemoveFromScheduler(seq);
    FinishPrefill(seq, result.status, result.metrics);
  }
}

void Engine::ProcessHandoffs(const std::vector<uint64_t>& completed) {
  FinishCompletedHandoffs(completed);
  const Clock::time_point now = Clock::now();
  std::vector<Sequence*> expired;
  for (auto& [serial, seq] : handing_off_) {
    if (now >= seq->handoff_deadline && !seq->handoff->done()) {
      expired.push_back(seq);
    }
  }
  for (Sequence* seq : expired) {
    handing_off_.erase(seq->handoff_serial);
    const absl::Status status = absl::DeadlineExceededError(absl::StrCat(
        "KV handoff of '", seq->request.id, "' was not confirmed within ",
        std::chrono::duration<double>(seq->handoff_timeout).count(), " s"));
    // After Detach the sender thread never reads the pool again, so the
    // blocks can go while it is still stuck in the sink.
    seq->handoff->Detach(status);
    detached_.push_back(std::move(seq->handoff));
    RemoveFromScheduler(seq);
    FinishPrefill(seq, status, KvHandoffMetrics{});
  }
  std::erase_if(detached_,
                [](const std::unique_ptr<KvHandoff>& h) { return h->done(); });
}

void Engine::FinishPrefill(Sequence* seq, absl::Status status,
                           const KvHandoffMetrics& handoff) {
  seq->metrics.finished = Clock::now();
  seq->metrics.generated_tokens = seq->num_generated();
  PrefillOutput out;
  out.request_id = seq->request.id;
  out.done = true;
  if (!status.ok()) {
    out.finish_reason = absl::IsCancelled(status) ? FinishReason::kCancelled
                                                  : FinishReason::kError;
    out.error = std::move(status);
  }
  out.handoff = handoff;
  out.metrics = seq->metrics;
  out.seed = seq->sampler->seed();
  const std::string id = seq->request.id;
  PrefillCallback callback = std::move(seq->on_prefill);
  live_.erase(id);  // destroys seq
  {
    absl::MutexLock lock(&inbox_mu_);
    ids_.erase(id);
  }
  if (callback) callback(out);
}

// --- Decode side ---

absl::StatusOr<ImportReservation> Engine::ReserveImport(
    const std::string& request_id, const ImportOptions& options) {
  BATON_RETURN_IF_ERROR(health());
  if (options.num_prompt_tokens < 1 || options.max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ReserveImport: num_prompt_tokens (", options.num_prompt_tokens,
        ") and max_tokens (", options.max_tokens, ") must be >= 1"));
  }
  const int64_t total = options.num_prompt_tokens + options.max_tokens;
  if (total > config().context_length) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReserveImport: prompt + max_tokens = ", total,
                     " exceeds the context length ", config().context_length));
  }
  if (!options.prompt.empty() && static_cast<int64_t>(options.prompt.size()) !=
                                     options.num_prompt_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ReserveImport: the prompt has ", options.prompt.size(),
        " token ids for num_prompt_tokens ", options.num_prompt_tokens));
  }
  for (int32_t token : options.prompt) {
    if (token < 0 || token >= config().vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("ReserveImport: prompt token id ", token,
                       " is outside [0, ", config().vocab_size, ")"));
    }
  }
  auto slot = std::make_unique<ImportSlot>();
  // The prompt's full blocks before the one holding its last token: those
  // this engine may hold already.
  if (options_.prefix_cache && !options.prompt.empty()) {
    ExtendBlockHashes(prefix_root_, options.prompt, cache_->block_size(),
                      (options.num_prompt_tokens - 1) / cache_->block_size(),
                      &slot->prefix_hashes);
  }
  slot->request_id = request_id;
  slot->transfer_id = options.transfer_id;
  slot->secret = options.secret;
  slot->model_id = options.model_id;
  slot->num_tokens = options.num_prompt_tokens;
  slot->max_tokens = options.max_tokens;
  slot->on_landed = options.on_landed;
  absl::MutexLock lock(&cache_mu_);
  if (imports_by_transfer_.contains(options.transfer_id)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV transfer id ", options.transfer_id, " is already reserved"));
  }
  BlockAllocator& allocator = cache_->allocator();
  // Pinned with the reservation, in one step under the cache lock.
  slot->prefix_hashes.resize(
      static_cast<size_t>(allocator.MatchPrefix(slot->prefix_hashes)));
  if (!allocator.CanReserveWithPrefix(slot->prefix_hashes, total)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV import of '", request_id, "' needs ", cache_->BlocksNeeded(total),
        " blocks (", total, " tokens, ", slot->prefix_hashes.size(),
        " of them cached here), but only ", cache_->num_blocks_free(), " of ",
        cache_->num_blocks_total(), " are free"));
  }
  {
    absl::MutexLock ids_lock(&inbox_mu_);
    if (!ids_.emplace(request_id, true).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("request id '", request_id, "' is already in use"));
    }
  }
  allocator.AcquirePrefix(slot->table, slot->prefix_hashes);
  BATON_CHECK(allocator.Reserve(slot->table, total).ok());
  slot->first_block = static_cast<int64_t>(slot->prefix_hashes.size());
  if (options_.prefix_cache && !options.prompt.empty()) {
    import_prefix_queries_.fetch_add(options.num_prompt_tokens,
                                     std::memory_order_relaxed);
    import_prefix_hits_.fetch_add(slot->first_block * cache_->block_size(),
                                  std::memory_order_relaxed);
  }
  ImportReservation reservation;
  reservation.num_blocks = slot->table.num_blocks();
  reservation.cached_blocks = slot->first_block;
  reservation.target = TargetOf(*slot);
  imports_by_transfer_.emplace(options.transfer_id, slot.get());
  imports_.emplace(request_id, std::move(slot));
  return reservation;
}

absl::StatusOr<KvTransferTarget> Engine::ImportTarget(uint64_t transfer_id,
                                                      bool lands_on_device) {
  absl::MutexLock lock(&cache_mu_);
  auto it = imports_by_transfer_.find(transfer_id);
  if (it == imports_by_transfer_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no KV reservation for transfer ", transfer_id));
  }
  ImportSlot* slot = it->second;
  if (slot->state != ImportSlot::State::kReserved) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV transfer ", transfer_id, " for '", slot->request_id,
                     "' already started"));
  }
  if (!lands_on_device && staging_ != nullptr) {
    // A host transport into a device pool: it writes the carried blocks to
    // a staging area, copied in when the sequence is adopted.
    absl::StatusOr<std::unique_ptr<StagedKv>> staged = staging_->Acquire(
        cache_->BlocksNeeded(slot->num_tokens) - slot->first_block);
    if (!staged.ok()) {
      return PrefixStatus(
          absl::StrCat("staging KV transfer ", transfer_id, " on the host: "),
          staged.status());
    }
    slot->staged = std::move(*staged);
  }
  slot->state = ImportSlot::State::kTransferring;
  return TargetOf(*slot);
}

KvTransferTarget Engine::TargetOf(const ImportSlot& slot) {
  KvTransferTarget target;
  target.cache = cache_.get();
  target.table = &slot.table;
  target.expected_layout = cache_->layout();
  target.num_tokens = slot.num_tokens;
  target.first_block = slot.first_block;
  target.cache_mutex = &cache_mu_;
  target.expected_model_id = slot.model_id;
  target.expected_request_id = slot.request_id;
  if (slot.staged != nullptr) {
    target.cache = &slot.staged->cache();
    target.table = &slot.staged->table();
    target.cache_mutex = slot.staged->mutex();
    target.staged = true;
  }
  return target;
}

absl::StatusOr<std::string> Engine::ImportSecret(uint64_t transfer_id) {
  absl::MutexLock lock(&cache_mu_);
  auto it = imports_by_transfer_.find(transfer_id);
  if (it == imports_by_transfer_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no KV reservation for transfer ", transfer_id));
  }
  return it->second->secret;
}

absl::StatusOr<KvTransferTarget> Engine::DeviceImportTarget(
    uint64_t transfer_id) {
  if (device_kv_pool() == nullptr) {
    return absl::FailedPreconditionError(
        "this worker's KV pool is not in device memory; send over HOST_TCP");
  }
  return ImportTarget(transfer_id, /*lands_on_device=*/true);
}

void Engine::ImportDone(uint64_t transfer_id, absl::Status status) {
  std::function<void(absl::Status)> on_landed;
  {
    absl::MutexLock lock(&cache_mu_);
    auto it = imports_by_transfer_.find(transfer_id);
    if (it == imports_by_transfer_.end()) return;
    ImportSlot* slot = it->second;
    if (slot->state != ImportSlot::State::kTransferring) return;
    on_landed = slot->on_landed;
    if (slot->cancelled) {
      cache_->Free(slot->table);
      const std::string id = slot->request_id;
      imports_by_transfer_.erase(it);
      imports_.erase(id);
      {
        absl::MutexLock ids_lock(&inbox_mu_);
        ids_.erase(id);
      }
      if (status.ok()) status = absl::CancelledError("import cancelled");
    } else if (status.ok()) {
      slot->state = ImportSlot::State::kLanded;
    } else {
      cache_->Free(slot->table);
      slot->staged.reset();
      slot->state = ImportSlot::State::kFailed;
      slot->error = status;
    }
  }
  if (on_landed) on_landed(status);
}

KvReceiverCallbacks Engine::ImportCallbacks() {
  KvReceiverCallbacks callbacks;
  callbacks.secret = [this](uint64_t transfer_id) {
    return ImportSecret(transfer_id);
  };
  callbacks.lookup =
      [this](uint64_t transfer_id) -> absl::StatusOr<KvTransferTarget> {
    BATON_RETURN_IF_ERROR(FaultPoints::Global().Hit(kFaultKvImportStarted));
    return ImportTarget(transfer_id);
  };
  callbacks.on_layer = [](uint64_t, int64_t) {
    // Only stopping or crashing there means anything (a test's kill
    // mid-import); the import goes on whatever the hit says.
    FaultPoints::Global().Hit(kFaultKvLayerImported).IgnoreError();
  };
  callbacks.on_done = [this](uint64_t transfer_id, absl::Status status) {
    ImportDone(transfer_id, std::move(status));
  };
  return callbacks;
}

bool Engine::CancelImport(const std::string& request_id) {
  absl::MutexLock lock(&cache_mu_);
  auto it = imports_.find(request_id);
  if (it == imports_.end()) return false;
  ImportSlot* slot = it->second.get();
  if (slot->state == ImportSlot::State::kTransferring) {
    slot->cancelled = true;  // ImportDone frees once the receiver lets go
    return true;
  }
  cache_->Free(slot->table);
  imports_by_transfer_.erase(slot->transfer_id);
  imports_.erase(it);
  absl::MutexLock ids_lock(&inbox_mu_);
  ids_.erase(request_id);
  return true;
}

absl::Status Engine::StartImportedDecode(GenerationRequest request,
                                         std::vector<int32_t> generated,
                                         OutputCallback on_output) {
  const std::string id = request.id;
  const int64_t num_generated = static_cast<int64_t>(generated.size());
  if (num_generated < 1 || num_generated > request.params.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StartImportedDecode: generated holds ", num_generated,
        " tokens; it needs 1 to max_tokens (", request.params.max_tokens, ")"));
  }
  for (int32_t token : generated) {
    if (token < 0 || token >= config().vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("generated token id ",
                                                     token, " is outside [0, ",
                                                     config().vocab_size, ")"));
    }
  }
  const int64_t max_total =
      static_cast<int64_t>(request.prompt.size()) + request.params.max_tokens;
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<Sequence> seq,
                         NewSequence(std::move(request), max_total));
  {
    absl::MutexLock lock(&cache_mu_);
    auto it = imports_.find(id);
    if (it == imports_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no KV import reserved for request '", id, "'"));
    }
    ImportSlot* slot = it->second.get();
    if (slot->state == ImportSlot::State::kFailed) {
      const absl::Status error = PrefixStatus(
          absl::StrCat("KV import of '", id, "' failed: "), slot->error);
      imports_by_transfer_.erase(slot->transfer_id);
      imports_.erase(it);
      absl::MutexLock ids_lock(&inbox_mu_);
      ids_.erase(id);
      return error;
    }
    if (slot->state != ImportSlot::State::kLanded) {
      return absl::FailedPreconditionError(
          absl::StrCat("KV import of '", id, "' has not landed yet (transfer ",
                       slot->transfer_id, ")"));
    }
    if (seq->num_prompt != slot->num_tokens ||
        seq->request.params.max_tokens > slot->max_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "StartImportedDecode: prompt of ", seq->num_prompt,
          " tokens and max_tokens ", seq->request.params.max_tokens,
          " do not fit the reservation (", slot->num_tokens, " prompt tokens, ",
          slot->max_tokens, " max_tokens)"));
    }
    // The cached blocks hold the KV of the prompt reserved for: this one
    // must begin with the same tokens.
    ExtendBlockHashes(prefix_root_, seq->tokens, cache_->block_size(),
                      slot->first_block, &seq->block_hashes);
    if (!std::equal(slot->prefix_hashes.begin(), slot->prefix_hashes.end(),
                    seq->block_hashes.begin())) {
      seq->block_hashes.clear();
      return absl::InvalidArgumentError(absl::StrCat(
          "StartImportedDecode: the prompt's first ", slot->first_block,
          " blocks differ from those of the prompt ReserveKv was given"));
    }
    seq->table = std::move(slot->table);
    seq->staged_import = std::move(slot->staged);
    seq->import_first_block = slot->first_block;
    seq->num_published = slot->first_block;
    BATON_CHECK(cache_->SetNumTokens(seq->table, slot->num_tokens).ok());
    imports_by_transfer_.erase(slot->transfer_id);
    imports_.erase(it);
  }
  // The cache holds the prompt; the generated tokens are fed from here on
  // (one token: the next step is a plain decode).
  seq->num_cached = seq->num_prompt;
  seq->metrics.first_scheduled = seq->metrics.arrival;
  seq->metrics.first_token = seq->metrics.arrival;
  RequestOutput out;
  out.request_id = id;
  FinishReason reason = FinishReason::kNone;
  for (int32_t token : generated) {
    seq->sampler->Accept(token);
    seq->tokens.push_back(token);
    if (reason == FinishReason::kNone)
      reason = AdvanceText(seq.get(), token, &out);
  }
  if (reason != FinishReason::kNone) FlushText(seq.get(), &reason, &out);
  out.finish_reason = reason;
  seq->initial_output = std::move(out);
  seq->on_output = std::move(on_output);
  return Enqueue(std::move(seq), /*id_reserved=*/true);
}

}  // namespace baton
