// The inference engine of one worker: requests in, token streams out.
// Each Step() is schedule -> run the model -> post-process (sample, detect
// stops, detokenize, stream). Thread-safe: Submit, SubmitPrefill, Cancel and
// the import calls may be called from any thread; Step runs on one engine
// thread (or the caller's).
//
// Prefill/decode disaggregation splits one request across two engines:
//   prefill engine: SubmitPrefill -> first token (+ seed) -> KV handed to a
//     KvSink layer by layer while the last chunk computes -> blocks freed
//     once the sink confirms the last layer (or on failure / cancel).
//   decode engine: ReserveImport (before the transfer) -> the receiver
//     writes through ImportTarget / ImportDone -> StartImportedDecode with
//     the first token -> the sequence decodes in the running batch.
// Tokens are bit-identical to a colocated run (same seed, batch invariance).
#ifndef BATON_WORKER_ENGINE_ENGINE_H_
#define BATON_WORKER_ENGINE_ENGINE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cpu/thread_pool.h"
#include "model/tokenizer/tokenizer.h"
#include "worker/engine/forward_runner.h"
#include "worker/engine/kv_handoff.h"
#include "worker/engine/kv_sink.h"
#include "worker/engine/kv_staging.h"
#include "worker/engine/model_runner.h"
#include "worker/engine/model_weights.h"
#include "worker/engine/prefill_rate.h"
#include "worker/engine/request.h"
#include "worker/engine/scheduler.h"
#include "worker/engine/sequence.h"
#include "worker/kv_cache/kv_cache.h"
#include "worker/transport/kv_transport.h"

namespace baton {

struct EngineOptions {
  // --- behaviour ---
  SchedulerOptions scheduler;
  // Tokens per KV block.
  int64_t block_size = 16;
  // Prefix cache: a request reuses the KV of the longest prefix of full
  // blocks an earlier request computed here (prompt or output), and freed
  // blocks stay cached until the pool needs them (scheduler.h). Tokens are
  // identical either way.
  bool prefix_cache = true;
  // Salts the prefix hashes with what else changes the KV besides the
  // tokens and the layout: the model id (the cache of one engine always
  // holds one model's KV; the id matters once hashes leave the worker).
  std::string model_id;
  // --- performance ---
  // Compute threads (the engine thread included).
  int num_threads = 1;
  // KV pool size: blocks, or 0 to size it from kv_cache_bytes.
  int64_t kv_cache_blocks = 0;
  // KV pool byte budget when kv_cache_blocks == 0.
  uint64_t kv_cache_bytes = uint64_t{512} << 20;
  // Touch the whole host pool at start (its pages committed up front), so
  // no request pays the page faults of the blocks it is first to use.
  bool kv_prefault = false;
  // --- device ---
  // Builds the runner over the engine's cache; null: the CPU ModelRunner. A
  // device runner (e.g. MakeCudaRunnerFactory) keeps the live KV in device
  // memory with the cache's layout and block ids; host transports then
  // stage only the blocks they carry (kv_staging.h).
  ForwardRunnerFactory make_runner;
};

struct PrefillOptions {
  // Required: opens the destination when the prompt's last chunk starts
  // (e.g. TcpKvSinkFactory(endpoint, transfer_id)).
  KvSinkFactory make_sink;
  // The handoff fails with DeadlineExceeded, and the blocks are freed, if
  // the sink has not confirmed the last layer this long after it started.
  Clock::duration timeout = std::chrono::seconds(30);
  // The sink reads the layers from the runner's device pool itself (its
  // chunks are device addresses; a CUDA IPC or NCCL sender), so the engine
  // does not stage them to the host first.
  bool sink_reads_device_pool = false;
  // Blocks of the prompt the destination holds already
  // (ImportReservation::cached_blocks, carried by the coordinator): the
  // handoff sends the blocks from this one on. In [0, BlocksNeeded(prompt)),
  // so the block of the last token always travels.
  int64_t first_block = 0;
};

struct ImportOptions {
  // Id of the transfer the prefill side will send (as in its KvSink).
  uint64_t transfer_id = 0;
  // The transfer's secret, which its sender must prove (kv_wire.h); the
  // receiver reads it through ImportCallbacks().secret.
  std::string secret;
  // The model id every layer header must carry; empty: not checked.
  std::string model_id;
  // Tokens the imported cache holds (the prompt), >= 1.
  int64_t num_prompt_tokens = 0;
  // The request's max_tokens; blocks are reserved for prompt + max_tokens.
  int64_t max_tokens = 0;
  // The prompt's token ids (num_prompt_tokens of them), or empty. With them
  // and the prefix cache on, the reservation starts with the longest cached
  // prefix of the prompt's full blocks, pinned (never the block of the last
  // token), and the transfer carries only the blocks after it
  // (ImportReservation::cached_blocks). StartImportedDecode then checks that
  // its prompt is the one reserved for.
  std::vector<int32_t> prompt;
  // Optional, runs on the receiver's thread once the transfer ended: OK
  // when every layer landed, otherwise the error (the blocks are then free
  // already).
  std::function<void(absl::Status)> on_landed;
};

struct ImportReservation {
  int64_t num_blocks = 0;
  // Leading blocks of the prompt found in this engine's prefix cache: the
  // sender starts at this block (PrefillOptions::first_block).
  int64_t cached_blocks = 0;
  // What the receiver writes into; valid until ImportDone for its transfer.
  KvTransferTarget target;
};

// Counts of queues are exact on the engine thread; the KV counts anywhere.
struct EngineStats {
  int64_t num_waiting = 0;
  int64_t num_running = 0;
  int64_t num_handoffs = 0;  // prefill-only requests handing off their KV
  int64_t num_imports = 0;   // reserved imports not yet started
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_free = 0;    // no request holds them (cached included)
  int64_t kv_blocks_cached = 0;  // free, holding a reusable prefix block
  int64_t kv_blocks_used = 0;    // held by requests (imports included)
  // Of kv_blocks_used: blocks reserved for KV imports whose transfer has
  // not landed yet (their cached prefix aside).
  int64_t kv_blocks_reserved = 0;
  // Prefix cache, over requests' first admissions and KV imports: prompt
  // tokens looked up, found cached; cached blocks evicted for room.
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t kv_evictions = 0;
  // A device runner's host staging (kv_staging.h): pool blocks held by
  // transfers now, and transfers staged in memory of their own because the
  // pool was full (since the engine started).
  int64_t kv_staging_blocks_used = 0;
  int64_t kv_staging_own_areas = 0;
  // Steps that ran a batch since the engine started: a worker whose count
  // stands still while it holds work has a wedged engine.
  int64_t steps = 0;
  // Prompt tokens prefilled per second of step time, recently (0 until a
  // step fed prompt tokens); see prefill_rate.h.
  double prefill_tokens_per_second = 0;
};

class Engine {
 public:
  // Loads nothing itself: weights and tokenizer are borrowed and must
  // outlive the engine.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(
      const EngineOptions& options, const ModelWeights* weights,
      const Tokenizer* tokenizer);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues a request. InvalidArgument naming the field (see
  // ValidateSamplingParams) or a duplicate id; ResourceExhausted if the
  // prompt plus max_tokens can never fit the KV pool; Unavailable naming
  // the fault once the runner is unhealthy (see health()). On success on_output
  // receives the stream, ending with a finish_reason, always on the thread
  // that runs Step().
  absl::Status Submit(GenerationRequest request, OutputCallback on_output);
  // Ends a live request with kCancelled and frees its blocks (at the next
  // Step). Unknown ids are ignored.
  // A reserved import not yet started (see ReserveImport) is freed at once,
  // or as soon as its in-flight transfer ends. A prefill-only request
  // handing off aborts the handoff; its blocks are freed when the sender
  // thread stops.
  void Cancel(const std::string& request_id);

  // --- Prefill side ---
  // Validates like Submit (only the prompt must fit the pool) and queues a
  // prefill-only request: its prompt is prefilled (chunked like any other),
  // the first token sampled with params, and its KV handed to
  // options.make_sink layer by layer as the last chunk computes each layer
  // (earlier chunks' layers are complete then; every layer is sent once).
  // on_output gets the events described at PrefillOutput, on the engine
  // thread. InvalidArgument as Submit, or if make_sink is missing.
  absl::Status SubmitPrefill(GenerationRequest request, PrefillOptions options,
                             PrefillCallback on_output);

  // --- Decode side ---
  // Reserves blocks for prompt + max_tokens tokens under request_id before
  // the transfer starts. ResourceExhausted with the numbers if the pool
  // cannot hold them now; InvalidArgument for a bad count or a request id /
  // transfer id already in use.
  absl::StatusOr<ImportReservation> ReserveImport(const std::string& request_id,
                                                  const ImportOptions& options);
  // KvReceiverCallbacks::lookup: the reservation of transfer_id (NotFound if
  // none, FailedPrecondition if its transfer already started).
  // lands_on_device: the receiver writes the runner's device pool
  // (device_kv_pool(), at the cache's offsets). Otherwise, with a device
  // runner, the target is a host staging area of just the carried blocks
  // (ResourceExhausted if none can be mapped), copied into the device pool
  // before the sequence decodes.
  absl::StatusOr<KvTransferTarget> ImportTarget(uint64_t transfer_id,
                                                bool lands_on_device = false);
  // ImportTarget(transfer_id, true) for a device-direct receiver, which
  // writes at device_kv_pool(); FailedPrecondition when the runner keeps no
  // device pool (the sender should use HOST_TCP).
  absl::StatusOr<KvTransferTarget> DeviceImportTarget(uint64_t transfer_id);
  // The reserved transfer's secret (ImportOptions::secret), without side
  // effects; NotFound for an unknown transfer.
  absl::StatusOr<std::string> ImportSecret(uint64_t transfer_id);
  // KvReceiverCallbacks::on_done: OK marks the import landed; an error frees
  // the reservation (StartImportedDecode then returns that error).
  void ImportDone(uint64_t transfer_id, absl::Status status);
  // lookup and on_done bound to this engine (the engine must outlive the
  // receiver).
  KvReceiverCallbacks ImportCallbacks();
  // Continues a request whose prompt KV has landed in its reservation.
  // request: the original prompt and params, with params.seed set to the
  // prefill's effective seed. generated: tokens sampled so far (at least the
  // first). Replays them into the sampler (the random stream continues), the
  // detokenizer and the stop checker, then joins the sequence to the running
  // batch. on_output's stream carries the tokens after `generated` and the
  // whole output text (generated's text included, as stop strings may span
  // the handoff). NotFound for no reservation, FailedPrecondition while the
  // transfer is in flight, the transfer's error if it failed (the
  // reservation is then released), InvalidArgument for a prompt length or
  // token that does not match.
  absl::Status StartImportedDecode(GenerationRequest request,
                                   std::vector<int32_t> generated,
                                   OutputCallback on_output);

  // Ends every request still here with kError and `reason` (Unavailable,
  // e.g. "worker shutting down"), each through its callback, and frees
  // their blocks; aborts and joins handoffs in flight. REQUIRES: no thread
  // steps the engine any more (the caller becomes the engine thread).
  // Reserved imports are freed by the destructor.
  void Shutdown(const absl::Status& reason);

  // Thread-safe. What changed in the prefix cache after event `after` (at
  // most max_events hashes), or with no `after`, or when the log no longer
  // reaches back that far, a snapshot: every published hash (at most
  // max_events of them; the rest are left out, which only costs a routing
  // hint).
  struct PrefixCacheEvents {
    bool snapshot = false;
    // The snapshot's hashes, or those whose last event was a publish.
    std::vector<BlockHash> stored;
    // Those whose last event was an eviction or reset (not in snapshots).
    std::vector<BlockHash> removed;
    uint64_t last_seq = 0;  // pass as `after` next time
  };
  PrefixCacheEvents PrefixCacheEventsSince(std::optional<uint64_t> after,
                                           size_t max_events);
  // Thread-safe. Forgets every cached prefix (blocks in use stay with their
  // requests, unshared from then on); returns how many blocks it dropped.
  int64_t ResetPrefixCache();
  bool prefix_cache_enabled() const { return options_.prefix_cache; }
  // The hash every request's block 0 chains from (prefix_hash.h).
  const BlockHash& prefix_root() const { return prefix_root_; }
  // One engine iteration; returns false if there was nothing to do.
  bool Step();
  // Steps until every submitted request has finished (waiting, not spinning,
  // while only handoffs are in flight).
  void RunUntilIdle();
  bool HasWork();
  // Thread-safe. `wake` is called on another thread when an event arrives
  // that Step must see and that no Submit or Cancel announces (a handoff's
  // confirmation), under the engine's inbox lock: it must only signal
  // (EngineLoop::Wake). nullptr clears it, before its owner goes.
  void SetWakeup(std::function<void()> wake);

  // Thread-safe. Queue and batch counts are as of the end of the last Step;
  // block counts are current.
  EngineStats stats();
  const ModelConfig& config() const { return weights_->config(); }
  KvCache& kv_cache() { return *cache_; }
  // Thread-safe. OK while the runner is healthy; after a device fault the
  // fault: every request in the failing step ended with it, later steps
  // fail theirs, and Submit / SubmitPrefill / ReserveImport refuse new work
  // (Unavailable). The worker then reports itself unhealthy.
  absl::Status health() const;
  // "cpu" or "cuda:N".
  std::string device_name() const { return runner_->device_name(); }
  // The runner's device KV pool (ForwardRunner::device_kv_pool), or null.
  uint8_t* device_kv_pool() const { return runner_->device_kv_pool(); }

 private:
  // Step's work, without publishing the counts for stats().
  bool StepOnce();
  Engine(const EngineOptions& options, const ModelWeights* weights,
         const Tokenizer* tokenizer)
      : options_(options), weights_(weights), tokenizer_(tokenizer) {}
  // A decode-side reservation, from ReserveImport until StartImportedDecode
  // (or Cancel). Guarded by Engine::cache_mu_.
  struct ImportSlot {
    enum class State { kReserved, kTransferring, kLanded, kFailed };
    std::string request_id;
    uint64_t transfer_id = 0;
    std::string secret;
    std::string model_id;
    int64_t num_tokens = 0;
    int64_t max_tokens = 0;
    // The cached prefix the reservation started with: its blocks are not
    // transferred; their hashes check the prompt StartImportedDecode gets.
    int64_t first_block = 0;
    std::vector<BlockHash> prefix_hashes;
    BlockTable table;
    State state = State::kReserved;
    // Where a host transport writes the blocks it carries for a device
    // runner (from the lookup on); null when the receiver writes the pool.
    std::unique_ptr<StagedKv> staged;
    bool cancelled = false;  // Cancel arrived while transferring
    absl::Status error;      // kFailed: why
    std::function<void(absl::Status)> on_landed;
  };

  // Where the receiver of slot's transfer writes.
  KvTransferTarget TargetOf(const ImportSlot& slot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(cache_mu_);
  // EngineStats::kv_blocks_reserved.
  int64_t ReservedImportBlocksLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(cache_mu_);
  // Validation and per-request state shared by Submit and SubmitPrefill.
  absl::StatusOr<std::unique_ptr<Sequence>> NewSequence(
      GenerationRequest request, int64_t pool_tokens);
  // Registers the id (unless id_reserved) and queues seq for the engine.
  absl::Status Enqueue(std::unique_ptr<Sequence> seq, bool id_reserved);
  void DrainInbox();
  // Adopts an arrived sequence (an imported one joins the running batch).
  void Adopt(std::unique_ptr<Sequence> seq);
  void CancelLive(const std::string& request_id);
  // Samples the next token for seq from logits and streams it; returns true
  // when the sequence finished.
  bool PostProcess(Sequence* seq, std::span<const float> logits);
  // Appends the accepted token's text to out->text; returns why the sequence
  // ends now (kNone: it goes on).
  FinishReason AdvanceText(Sequence* seq, int32_t token, RequestOutput* out);
  // Flushes held-back text of a sequence that ends for `*reason`.
  void FlushText(Sequence* seq, FinishReason* reason, RequestOutput* out);
  // Ends seq with an error or cancel, freeing its blocks (a handing-off
  // sequence: aborts the handoff, which finishes it later).
  void EndEarly(Sequence* seq, FinishReason reason, absl::Status status);
  void Finish(Sequence* seq, FinishReason reason, RequestOutput output,
              absl::Status error = absl::OkStatus());
  // Ends a prefill-only sequence whose blocks are free.
  void FinishPrefill(Sequence* seq, absl::Status status,
                     const KvHandoffMetrics& handoff);
  void StartHandoff(Sequence* seq);
  // Finishes handoffs that completed or timed out; reaps detached ones.
  void ProcessHandoffs(const std::vector<uint64_t>& completed);
  // Between the layers of a step: finishes the handoffs that completed
  // since it began, except those of prompts in the step itself (their
  // first token comes at its end, and must go first), so a handoff's report
  // does not wait for a long step of other prompts to end.
  void FinishHandoffsMidStep(const std::vector<uint64_t>& in_step);
  void FinishCompletedHandoffs(const std::vector<uint64_t>& completed);
  void RemoveFromScheduler(Sequence* seq);
  // The fault points of a step (kFaultPrefillStep when it prefills part of
  // a prompt, kFaultDecodeStep when it decodes); an injected error fails
  // the step as a runner error would.
  absl::Status HitStepFaultPoints(const std::vector<ScheduledItem>& scheduled);
  // Publishes the blocks the step filled in the prefix cache.
  void PublishFullBlocks(const std::vector<ScheduledItem>& scheduled);
  // Releases a reserved import not yet started; false if there is none.
  bool CancelImport(const std::string& request_id);
  void WaitForEvents();

  EngineOptions options_;
  const ModelWeights* weights_;
  const Tokenizer* tokenizer_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<ForwardRunner> runner_;
  // With a device runner: host staging for host transports (before every
  // table and handoff, which it outlives).
  std::unique_ptr<KvStagingPool> staging_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<int32_t> eos_ids_;
  BlockHash prefix_root_;
  uint64_t next_arrival_ = 0;

  // Guards the cache's allocation state (Reserve / Free / SetNumTokens of
  // tables outside a Forward) against ReserveImport and cancels on other
  // threads; receivers hold it shared around ImportLayer. The engine thread
  // takes it exclusively only around scheduling and frees, never during
  // Forward (which commits its own tables only).
  absl::Mutex cache_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<ImportSlot>> imports_
      ABSL_GUARDED_BY(cache_mu_);
  absl::flat_hash_map<uint64_t, ImportSlot*> imports_by_transfer_
      ABSL_GUARDED_BY(cache_mu_);

  // Owned by the engine thread.
  absl::flat_hash_map<std::string, std::unique_ptr<Sequence>> live_;
  std::vector<float> logits_;
  absl::flat_hash_map<uint64_t, Sequence*> handing_off_;  // by serial
  // Copies of the engine thread's counts for stats() on other threads.
  std::atomic<int64_t> published_waiting_{0};
  std::atomic<int64_t> published_running_{0};
  std::atomic<int64_t> published_steps_{0};
  std::atomic<int64_t> published_handoffs_{0};
  std::atomic<int64_t> published_prefix_queries_{0};
  std::atomic<int64_t> published_prefix_hits_{0};
  PrefillRate prefill_rate_;  // recorded by the engine thread
  // The prefix cache's lookups for KV imports (ReserveImport, any thread).
  std::atomic<int64_t> import_prefix_queries_{0};
  std::atomic<int64_t> import_prefix_hits_{0};
  std::vector<std::unique_ptr<KvHandoff>> detached_;  // timed out, joining
  uint64_t next_handoff_serial_ = 1;

  absl::Mutex inbox_mu_;
  std::vector<std::unique_ptr<Sequence>> inbox_ ABSL_GUARDED_BY(inbox_mu_);
  std::vector<std::string> cancels_ ABSL_GUARDED_BY(inbox_mu_);
  absl::flat_hash_map<std::string, bool> ids_ ABSL_GUARDED_BY(inbox_mu_);
  std::vector<uint64_t> handoffs_done_ ABSL_GUARDED_BY(inbox_mu_);
  std::function<void()> wakeup_ ABSL_GUARDED_BY(inbox_mu_);
};

}  // namespace baton

#endif  // BATON_WORKER_ENGINE_ENGINE_H_
