// kv_transfer_bench, part 3: a split prefill between two engines in one
// process over loopback TCP: the sender's transfer time, the part of it left
// after the last layer's compute (exposed), and the prefill compute time.
#ifndef BATON_BENCH_KV_OVERLAP_H_
#define BATON_BENCH_KV_OVERLAP_H_

#include <cstdint>

#include "bench/kv_bench_util.h"
#include "model/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "worker/engine/model_weights.h"

namespace baton::kvbench {

struct OverlapOptions {
  int64_t prompt_tokens = 1024;  // capped to the model's context
  int64_t chunk_tokens = 0;      // prefill chunk budget; 0 = whole prompt
  int threads = 1;               // prefill engine's compute threads
  int repeats = 1;               // split prefills (median reported)
  bool baseline = true;          // also time the prefill with no transfer
};

// Runs the split prefills of one case; every figure (per repeat and the
// medians) in the returned JSON. Exits on any error.
nlohmann::json OverlapCase(const Shape& shape, const ModelWeights& weights,
                           const Tokenizer& tokenizer,
                           const OverlapOptions& options);

}  // namespace baton::kvbench

#endif  // BATON_BENCH_KV_OVERLAP_H_
