// A request inside the engine: its tokens, cache blocks, sampling and
// detokenization state. Owned by the Engine; the Scheduler moves it between
// the waiting and running queues.
#ifndef BATON_WORKER_ENGINE_SEQUENCE_H_
#define BATON_WORKER_ENGINE_SEQUENCE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "model/tokenizer/incremental_decoder.h"
#include "worker/engine/kv_handoff.h"
#include "worker/engine/kv_sink.h"
#include "worker/engine/kv_staging.h"
#include "worker/engine/request.h"
#include "worker/kv_cache/block_table.h"
#include "worker/kv_cache/prefix_hash.h"
#include "worker/sampler/sampler.h"
#include "worker/sampler/stop_checker.h"

namespace baton {

struct Sequence {
  GenerationRequest request;
  OutputCallback on_output;
  // Prompt and generated tokens; the cache holds the first num_cached.
  std::vector<int32_t> tokens;
  int64_t num_prompt = 0;
  int64_t num_cached = 0;
  BlockTable table;
  // Prefix cache: hashes of the tokens' first full blocks (computed as
  // needed), how many of the table's blocks are published or were shared
  // at admission, and whether it was ever admitted.
  std::vector<BlockHash> block_hashes;
  int64_t num_published = 0;
  bool admitted = false;
  std::unique_ptr<RequestSampler> sampler;
  std::unique_ptr<IncrementalDecoder> detokenizer;
  std::unique_ptr<StopChecker> stop_checker;
  RequestMetrics metrics;
  // FCFS: waiting prompts are admitted in order of (arrival_us,
  // arrival_order): when the request reached the cluster (FcfsArrival), then
  // the order in which it reached this engine.
  int64_t arrival_us = 0;
  uint64_t arrival_order = 0;

  // --- Prefill-only requests (on_prefill set instead of on_output) ---
  PrefillCallback on_prefill;
  KvSinkFactory make_sink;
  bool sink_reads_device_pool = false;  // no host staging for the handoff
  // Blocks the destination holds already; the handoff sends those after.
  int64_t handoff_first_block = 0;
  // Started with the step that runs the prompt's last chunk. A device
  // runner's handoff over a host transport reads staged_handoff, which the
  // step fills layer by layer (ForwardRunner::CopyLayerToHost).
  std::unique_ptr<StagedKv> staged_handoff;
  std::unique_ptr<KvHandoff> handoff;
  uint64_t handoff_serial = 0;
  Clock::time_point handoff_deadline;
  Clock::duration handoff_timeout{};

  // --- Imported requests (Engine::StartImportedDecode) ---
  // The first output, produced when the imported tokens were replayed into
  // the detokenizer and stop checker; sent when the engine adopts it.
  std::optional<RequestOutput> initial_output;
  // A device runner's import that arrived over a host transport: the
  // staged blocks, copied into the pool when the engine adopts it.
  std::unique_ptr<StagedKv> staged_import;
  // Blocks of the imported prompt that were this engine's cached prefix
  // (not transferred, so not copied to the device either).
  int64_t import_first_block = 0;

  bool prefill_only() const { return static_cast<bool>(on_prefill); }

  int64_t num_generated() const {
    return static_cast<int64_t>(tokens.size()) - num_prompt;
  }
  // Tokens still to be fed before the next sample: the rest of the prompt
  // (or, after preemption, of prompt + output so far), or 1 when decoding.
  int64_t num_uncached() const {
    return static_cast<int64_t>(tokens.size()) - num_cached;
  }
};

}  // namespace baton

#endif  // BATON_WORKER_ENGINE_SEQUENCE_H_
