// The inference engine of one worker: requests in, token streams out.
// Each Step() is schedule -> run the model -> post-process (sample, detect
// stops, detokenize, stream). Thread-safe: Submit and Cancel may be called
// from any thread; Step runs on one engine thread (or the caller's).
#ifndef BATON_WORKER_ENGINE_ENGINE_H_
#define BATON_WORKER_ENGINE_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cpu/thread_pool.h"
#include "model/tokenizer/tokenizer.h"
#include "worker/engine/model_runner.h"
#include "worker/engine/model_weights.h"
#include "worker/engine/request.h"
#include "worker/engine/scheduler.h"
#include "worker/engine/sequence.h"
#include "worker/kv_cache/kv_cache.h"

namespace baton {

struct EngineOptions {
  // --- behaviour ---
  SchedulerOptions scheduler;
  // Tokens per KV block.
  int64_t block_size = 16;
  // --- performance ---
  // Compute threads (the engine thread included).
  int num_threads = 1;
  // KV pool size: blocks, or 0 to size it from kv_cache_bytes.
  int64_t kv_cache_blocks = 0;
  // KV pool byte budget when kv_cache_blocks == 0.
  uint64_t kv_cache_bytes = uint64_t{512} << 20;
};

struct EngineStats {
  int64_t num_waiting = 0;
  int64_t num_running = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_free = 0;
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
  // prompt plus max_tokens can never fit the KV pool. On success on_output
  // receives the stream, ending with a finish_reason, always on the thread
  // that runs Step().
  absl::Status Submit(GenerationRequest request, OutputCallback on_output);
  // Ends a live request with kCancelled and frees its blocks (at the next
  // Step). Unknown ids are ignored.
  void Cancel(const std::string& request_id);

  // One engine iteration; returns false if there was nothing to do.
  bool Step();
  // Steps until every submitted request has finished.
  void RunUntilIdle();
  bool HasWork();

  EngineStats stats();
  const ModelConfig& config() const { return weights_->config(); }
  KvCache& kv_cache() { return *cache_; }

 private:
  Engine(const EngineOptions& options, const ModelWeights* weights,
         const Tokenizer* tokenizer)
      : options_(options), weights_(weights), tokenizer_(tokenizer) {}
  void DrainInbox();
  // Samples the next token for seq from logits and streams it; returns true
  // when the sequence finished.
  bool PostProcess(Sequence* seq, std::span<const float> logits);
  void Finish(Sequence* seq, FinishReason reason, RequestOutput output,
              absl::Status error = absl::OkStatus());

  EngineOptions options_;
  const ModelWeights* weights_;
  const Tokenizer* tokenizer_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<int32_t> eos_ids_;
  uint64_t next_arrival_ = 0;

  // Owned by the engine thread.
  absl::flat_hash_map<std::string, std::unique_ptr<Sequence>> live_;
  std::vector<float> logits_;

  absl::Mutex inbox_mu_;
  std::vector<std::unique_ptr<Sequence>> inbox_ ABSL_GUARDED_BY(inbox_mu_);
  std::vector<std::string> cancels_ ABSL_GUARDED_BY(inbox_mu_);
  absl::flat_hash_map<std::string, bool> ids_ ABSL_GUARDED_BY(inbox_mu_);
};

}  // namespace baton

#endif  // BATON_WORKER_ENGINE_ENGINE_H_
