// The Llama forward pass over a batch of sequences, each contributing a run
// of new tokens (a prefill chunk or one decode token) on top of what its
// paged KV cache already holds.
//
// Per layer: RMSNorm -> Q/K/V projections (+bias) -> RoPE -> K/V written to
// the cache -> causal GQA attention over the cache -> output projection ->
// residual; RMSNorm -> SwiGLU MLP -> residual. Then the final norm and the
// vocabulary projection for the rows that want logits.
//
// Batch invariance: every op computes a token's values from that token's row
// (and its own sequence's cache) with a fixed reduction order, so a
// sequence's logits are bit-identical whatever else is in the batch and
// however its prompt was chunked.
#ifndef BATON_WORKER_ENGINE_MODEL_RUNNER_H_
#define BATON_WORKER_ENGINE_MODEL_RUNNER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/thread_pool.h"
#include "worker/engine/forward_runner.h"
#include "worker/engine/model_weights.h"
#include "worker/kv_cache/kv_cache.h"

namespace baton {

// OK if `layout` is an F16 KV cache shaped for `config` (layers, KV heads,
// head dim); otherwise InvalidArgument naming the mismatch. `runner` names
// the runner in the message ("CPU", "CUDA").
absl::Status CheckKvLayoutFitsModel(const ModelConfig& config,
                                    const KvLayout& layout,
                                    absl::string_view runner);

// The RoPE options of the model (its config, rope_freqs tensor and
// scaling); the CPU and CUDA runners build their tables from them.
// Unimplemented for YaRN scaling; RopeTable::Create checks the rest.
absl::StatusOr<RopeOptions> ModelRopeOptions(const ModelWeights& weights);

class ModelRunner : public ForwardRunner {
 public:
  // The runner borrows all three; the cache must be F16 and shaped for the
  // model. `isa`: the kernels' path (every path gives the same logits; a
  // test runs each). FailedPrecondition if this CPU lacks it.
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(
      const ModelWeights* weights, KvCache* cache, ThreadPool* pool,
      CpuIsa isa = BestCpuIsa());

  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // Runs the items as one batch. On success each item's table holds
  // start_pos + tokens.size() tokens, and `logits` holds, item by item, one
  // row of vocab_size floats per requested position. InvalidArgument (naming
  // the item) for a token id outside the vocabulary, start_pos different
  // from the cached token count, a table too small, or a position beyond the
  // context length; nothing is written then.
  absl::Status Forward(std::span<const ForwardItem> items,
                       std::vector<float>* logits,
                       const LayerDoneFn& on_layer_done = nullptr) override;

  const ModelConfig& config() const { return weights_->config(); }

 private:
  ModelRunner(const ModelWeights* weights, KvCache* cache, ThreadPool* pool,
              CpuIsa isa)
      : weights_(weights), cache_(cache), pool_(pool), isa_(isa) {}
  absl::Status Validate(std::span<const ForwardItem> items) const;
  absl::Status Layer(int64_t l, std::span<const ForwardItem> items);
  void Attention(int64_t l, std::span<const ForwardItem> items);

  const ModelWeights* weights_;
  KvCache* cache_;
  ThreadPool* pool_;
  const CpuIsa isa_;
  std::unique_ptr<RopeTable> rope_;

  // Activations for the current batch, [tokens, width].
  int64_t tokens_ = 0;
  std::vector<int64_t> token_item_;  // item index of each token
  std::vector<int64_t> token_pos_;   // position of each token
  // Attention's runs of consecutive positions of one item: first token, count.
  struct QueryRun {
    int64_t first;
    int64_t count;
  };
  std::vector<QueryRun> runs_;
  std::vector<float> x_, h_, q_, k_, v_, attn_, gate_, up_;
  MatMulInput input_;
};

}  // namespace baton

#endif  // BATON_WORKER_ENGINE_MODEL_RUNNER_H_
