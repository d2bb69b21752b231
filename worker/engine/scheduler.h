// Decides each engine step's batch: every running decode gets one token,
// then waiting prompts are prefilled in chunks, first come first served, under
// a per-step token budget (vLLM-style chunked prefill mixed with decode).
// "First come" is by arrival at the cluster (Sequence::arrival_us), not at
// this engine: prompts whose calls reach a worker within a few ms of each
// other arrive here in whatever order its threads ran.
//
// KV blocks: a prompt's blocks are reserved in full when it is admitted, and
// a decode reserves one more block when its next token starts one. When the
// pool cannot grow a running sequence, the most recently admitted running
// sequence is preempted: its blocks are freed and it goes back to the front
// of the waiting queue to be recomputed (prompt + output so far). A prompt is
// admitted only if the pool can hold it, so admission stops when the pool is
// full instead of thrashing.
//
// Prefix cache: at admission a sequence takes the longest published prefix
// of its tokens' full blocks (BlockAllocator::AcquirePrefix, shared, no
// copy) and is prefilled from there. At least the block holding its last
// token is always computed into a block of its own, so the logits exist and
// nothing is written into a shared block.
#ifndef BATON_WORKER_ENGINE_SCHEDULER_H_
#define BATON_WORKER_ENGINE_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <vector>

#include "worker/engine/sequence.h"
#include "worker/kv_cache/kv_cache.h"

namespace baton {

struct SchedulerOptions {
  // Most sequences decoding at once.
  int64_t max_num_seqs = 64;
  // Most tokens (prefill chunk tokens + one per decode) in one step.
  int64_t max_num_batched_tokens = 512;
};

struct PrefixCacheConfig {
  bool enabled = false;
  // The parent hash of every sequence's block 0 (PrefixRootHash).
  BlockHash root;
};

struct ScheduledItem {
  Sequence* seq;
  int64_t num_tokens;  // fed this step, starting at seq->num_cached
  bool samples;        // the step ends this sequence's uncached tokens
};

class Scheduler {
 public:
  Scheduler(const SchedulerOptions& options, KvCache* cache,
            const PrefixCacheConfig& prefix = {})
      : options_(options), cache_(cache), prefix_(prefix) {}

  // Queues seq behind every waiting sequence that arrived no later than it
  // (arrival_us, then arrival_order), ahead of those that arrived later.
  void AddWaiting(Sequence* seq);
  // Joins a sequence whose blocks already hold its cached tokens (an
  // imported one) straight to the running batch. It counts against
  // max_num_seqs for later admissions only.
  void AddRunning(Sequence* seq) { running_.push_back(seq); }
  // Removes seq from whichever queue holds it and frees its blocks.
  void Remove(Sequence* seq);
  // Removes seq from whichever queue holds it; its blocks stay reserved
  // (a prefill-only sequence whose cache is being handed off).
  void Detach(Sequence* seq);

  // The next step's batch (empty when there is nothing to do). Preempted
  // sequences are reported in *preempted (their outputs so far stay valid).
  std::vector<ScheduledItem> Schedule(std::vector<Sequence*>* preempted);

  bool HasWork() const { return !waiting_.empty() || !running_.empty(); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  // Over first admissions: prompt tokens looked up, and found cached.
  int64_t prefix_query_tokens() const { return prefix_query_tokens_; }
  int64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }

 private:
  void Preempt(Sequence* seq);
  // Admits seq if the pool can hold all its tokens, sharing its longest
  // cached prefix; false (nothing changed) if it cannot.
  bool Admit(Sequence* seq);

  SchedulerOptions options_;
  KvCache* cache_;
  PrefixCacheConfig prefix_;
  int64_t prefix_query_tokens_ = 0;
  int64_t prefix_hit_tokens_ = 0;
  // FCFS (AddWaiting); preempted ones return to the front.
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // admitted, in admission order
};

// The FCFS key of a request stamped `stamped_us` by a coordinator
// (GenerationRequest::arrival_unix_us) that reaches an engine at `here_us`
// (both µs since the Unix epoch): the stamp, so prompts are admitted in the
// order they reached the cluster whatever order their calls took to get
// here; `here_us` for an unstamped one (<= 0). The stamp is taken no later
// than `here_us` and no earlier than kMaxArrivalLeadUs before it, so a
// coordinator whose clock is off puts its requests at most that far ahead
// of others.
inline constexpr int64_t kMaxArrivalLeadUs = 10'000'000;
int64_t FcfsArrival(int64_t stamped_us, int64_t here_us);
// The same, arriving now.
int64_t FcfsArrivalNow(int64_t stamped_us);

// The other side of the prefix cache: publishes the full blocks of `seq`
// that its cache holds (num_cached) and were not yet published, under their
// hashes chained from `root`, so a later admission can share them. The
// engine calls it for every sequence of every step (prompt and output
// blocks alike). A block another already holds under the same hash (two
// requests computed one prefix at once) stays private.
void PublishFullBlocks(const BlockHash& root, BlockAllocator& allocator,
                       Sequence* seq);

}  // namespace baton

#endif  // BATON_WORKER_ENGINE_SCHEDULER_H_
