// A request inside the engine: its tokens, cache blocks, sampling and
// detokenization state. Owned by the Engine; the Scheduler moves it between
// the waiting and running queues.
#ifndef BATON_WORKER_ENGINE_SEQUENCE_H_
#define BATON_WORKER_ENGINE_SEQUENCE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "model/tokenizer/incremental_decoder.h"
#include "worker/engine/request.h"
#include "worker/kv_cache/block_table.h"
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
  std::unique_ptr<RequestSampler> sampler;
  std::unique_ptr<IncrementalDecoder> detokenizer;
  std::unique_ptr<StopChecker> stop_checker;
  RequestMetrics metrics;
  uint64_t arrival_order = 0;  // FCFS key

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
