#include "worker/engine/model_runner.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/swiglu.h"

namespace baton {

absl::Status CheckKvLayoutFitsModel(const ModelConfig& c,
                                    const KvLayout& layout,
                                    absl::string_view runner) {
  if (layout.num_layers != c.num_layers ||
      layout.num_kv_heads != c.num_kv_heads || layout.head_dim != c.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache layout ", layout.ToString(),
                     " does not fit the model (", c.num_layers, " layers, ",
                     c.num_kv_heads, " kv heads, head dim ", c.head_dim, ")"));
  }
  if (layout.dtype != DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", runner, " model runner needs an F16 KV cache"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RopeOptions> ModelRopeOptions(const ModelWeights& weights) {
  const ModelConfig& c = weights.config();
  RopeOptions rope;
  rope.head_dim = c.head_dim;
  rope.rope_dim = c.rope_dim;
  rope.theta = c.rope_theta;
  rope.interleaved = c.rope_style == RopeStyle::kInterleaved;
  rope.max_positions = c.context_length;
  if (!weights.rope_freq_factors().empty()) {
    rope.freq_factors = weights.rope_freq_factors();
  } else if (c.rope_scaling.type == RopeScalingType::kLlama3) {
    rope.freq_factors = Llama3FreqFactors(
        c.rope_dim, c.rope_theta, c.rope_scaling.factor,
        c.rope_scaling.low_freq_factor, c.rope_scaling.high_freq_factor,
        c.rope_scaling.original_context_length);
  } else if (c.rope_scaling.type == RopeScalingType::kLinear) {
    rope.linear_factor = c.rope_scaling.factor;
  } else if (c.rope_scaling.type == RopeScalingType::kYarn) {
    return absl::UnimplementedError("YaRN rope scaling is not implemented");
  }
  return rope;
}

absl::StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::Create(
    const ModelWeights* weights, KvCache* cache, ThreadPool* pool, CpuIsa isa) {
  BATON_RETURN_IF_ERROR(
      CheckKvLayoutFitsModel(weights->config(), cache->layout(), "CPU"));
  if (!IsCpuIsaSupported(isa)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CPU kernel path ", CpuIsaName(isa), " is not supported by this CPU"));
  }
  std::unique_ptr<ModelRunner> runner(
      new ModelRunner(weights, cache, pool, isa));
  BATON_ASSIGN_OR_RETURN(RopeOptions rope, ModelRopeOptions(*weights));
  BATON_ASSIGN_OR_RETURN(runner->rope_, RopeTable::Create(rope));
  return runner;
}

absl::Status ModelRunner::Validate(std::span<const ForwardItem> items) const {
  const ModelConfig& c = config();
  for (size_t i = 0; i < items.size(); ++i) {
    const ForwardItem& item = items[i];
    const int64_t end =
        item.start_pos + static_cast<int64_t>(item.tokens.size());
    if (item.table == nullptr || item.tokens.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch item ", i, " has no table or no tokens"));
    }
    if (item.start_pos != item.table->num_tokens()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch item ", i, " starts at position ", item.start_pos,
          " but its cache holds ", item.table->num_tokens(), " tokens"));
    }
    if (end > c.context_length) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch item ", i, " reaches position ", end,
                       ", beyond the context length ", c.context_length));
    }
    if (cache_->Capacity(*item.table) < end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch item ", i, " needs ", end, " cached tokens, its table holds ",
          cache_->Capacity(*item.table)));
    }
    for (int32_t token : item.tokens) {
      if (token < 0 || token >= c.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("batch item ", i, ": token id ", token,
                         " is outside [0, ", c.vocab_size, ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ModelRunner::Forward(std::span<const ForwardItem> items,
                                  std::vector<float>* logits,
                                  const LayerDoneFn& on_layer_done) {
  BATON_RETURN_IF_ERROR(Validate(items));
  const ModelConfig& c = config();
  const int64_t hidden = c.hidden_size;
  tokens_ = 0;
  for (const ForwardItem& item : items) tokens_ += item.tokens.size();
  token_item_.resize(tokens_);
  token_pos_.resize(tokens_);
  x_.resize(tokens_ * hidden);
  h_.resize(tokens_ * hidden);
  q_.resize(tokens_ * c.num_heads * c.head_dim);
  attn_.resize(q_.size());
  k_.resize(tokens_ * c.kv_dim());
  v_.resize(k_.size());
  gate_.resize(tokens_ * c.intermediate_size);
  up_.resize(gate_.size());

  int64_t t = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    for (size_t j = 0; j < items[i].tokens.size(); ++j, ++t) {
      token_item_[t] = static_cast<int64_t>(i);
      token_pos_[t] = items[i].start_pos + static_cast<int64_t>(j);
      const TensorView& embd = weights_->token_embd();
      const uint64_t row_bytes = embd.nbytes / c.vocab_size;
      BATON_RETURN_IF_ERROR(
          DequantizeRow(embd.dtype, embd.data + row_bytes * items[i].tokens[j],
                        x_.data() + t * hidden, hidden));
    }
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    BATON_RETURN_IF_ERROR(Layer(l, items));
    if (on_layer_done) on_layer_done(l);
  }
  for (const ForwardItem& item : items) {
    BATON_RETURN_IF_ERROR(cache_->SetNumTokens(
        *item.table,
        item.start_pos + static_cast<int64_t>(item.tokens.size())));
  }

  // Final norm and vocabulary projection for the requested rows only.
  std::vector<int64_t> rows;
  t = 0;
  for (const ForwardItem& item : items) {
    const int64_t n = item.tokens.size();
    if (item.logits == LogitsMode::kAll) {
      for (int64_t j = 0; j < n; ++j) rows.push_back(t + j);
    } else if (item.logits == LogitsMode::kLast) {
      rows.push_back(t + n - 1);
    }
    t += n;
  }
  const int64_t n_rows = rows.size();
  for (int64_t r = 0; r < n_rows; ++r) {
    RmsNorm(x_.data() + rows[r] * hidden, weights_->output_norm(), 1, hidden,
            static_cast<float>(c.rms_norm_eps), h_.data() + r * hidden);
  }
  logits->resize(n_rows * c.vocab_size);
  if (n_rows == 0) return absl::OkStatus();
  return MatMul(weights_->output(), h_.data(), n_rows, logits->data(), pool_,
                {.isa = isa_});
}

absl::Status ModelRunner::Layer(int64_t l, std::span<const ForwardItem> items) {
  const ModelConfig& c = config();
  const LayerWeights& w = weights_->layers()[l];
  const int64_t hidden = c.hidden_size;
  const int64_t q_dim = c.num_heads * c.head_dim;
  const int64_t kv_dim = c.kv_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);

  RmsNorm(x_.data(), w.attn_norm, tokens_, hidden, eps, h_.data());
  input_.Reset(h_.data(), tokens_, hidden);
  const MatMulTarget qkv[] = {
      {&w.wq, q_.data()}, {&w.wk, k_.data()}, {&w.wv, v_.data()}};
  BATON_RETURN_IF_ERROR(MatMulGroup(qkv, input_, pool_, {.isa = isa_}));
  for (int64_t t = 0; t < tokens_; ++t) {
    float* q = q_.data() + t * q_dim;
    float* k = k_.data() + t * kv_dim;
    float* v = v_.data() + t * kv_dim;
    if (w.bq != nullptr) {
      for (int64_t i = 0; i < q_dim; ++i) q[i] += w.bq[i];
      for (int64_t i = 0; i < kv_dim; ++i) k[i] += w.bk[i];
      for (int64_t i = 0; i < kv_dim; ++i) v[i] += w.bv[i];
    }
    rope_->Apply(q, c.num_heads, token_pos_[t]);
    rope_->Apply(k, c.num_kv_heads, token_pos_[t]);
    cache_->WriteKv(*items[token_item_[t]].table, l, token_pos_[t], k, v);
  }
  Attention(l, items);
  BATON_RETURN_IF_ERROR(
      MatMul(w.wo, attn_.data(), tokens_, h_.data(), pool_, {.isa = isa_}));
  for (int64_t i = 0; i < tokens_ * hidden; ++i) x_[i] += h_[i];

  RmsNorm(x_.data(), w.ffn_norm, tokens_, hidden, eps, h_.data());
  input_.Reset(h_.data(), tokens_, hidden);
  const MatMulTarget gate_up[] = {{&w.w_gate, gate_.data()},
                                  {&w.w_up, up_.data()}};
  BATON_RETURN_IF_ERROR(MatMulGroup(gate_up, input_, pool_, {.isa = isa_}));
  SwiGlu(gate_.data(), up_.data(), tokens_ * c.intermediate_size, gate_.data(),
         isa_);
  BATON_RETURN_IF_ERROR(
      MatMul(w.w_down, gate_.data(), tokens_, h_.data(), pool_, {.isa = isa_}));
  for (int64_t i = 0; i < tokens_ * hidden; ++i) x_[i] += h_[i];
  return absl::OkStatus();
}

void ModelRunner::Attention(int64_t l, std::span<const ForwardItem> items) {
  const ModelConfig& c = config();
  const int64_t q_dim = c.num_heads * c.head_dim;
  const KvLayerView layer = cache_->LayerView(l);
  AttentionShape shape{c.num_heads,
                       static_cast<float>(1.0 / std::sqrt(double(c.head_dim)))};
  // Each item's block pointers for this layer, per KV head: attention runs
  // per (run of tokens, KV head) so that even one decode token splits across
  // threads.
  const int64_t kvh = c.num_kv_heads;
  const int64_t group = c.num_heads / kvh;
  const uint64_t head_elems = layer.head_bytes / sizeof(uint16_t);
  std::vector<std::vector<const uint16_t*>> k_blocks(items.size() * kvh),
      v_blocks(items.size() * kvh);
  for (size_t i = 0; i < items.size(); ++i) {
    for (int32_t b : items[i].table->block_ids()) {
      for (int64_t g = 0; g < kvh; ++g) {
        k_blocks[i * kvh + g].push_back(layer.Keys<uint16_t>(b, 0) +
                                        g * head_elems);
        v_blocks[i * kvh + g].push_back(layer.Values<uint16_t>(b, 0) +
                                        g * head_elems);
      }
    }
  }
  // One KV head's slice of the [tokens][heads][head_dim] queries.
  const AttentionShape group_shape{group, shape.scale, q_dim};
  // Runs of up to kAttentionQueryTile consecutive positions of one item, so
  // the kernel reads each K and V row once for all of a run's queries
  // (a decode token is a run of one). The kernel computes each query the
  // same way whatever run it is in: same bits for any split.
  runs_.clear();
  for (int64_t t = 0; t < tokens_;) {
    int64_t n = 1;
    while (n < kAttentionQueryTile && t + n < tokens_ &&
           token_item_[t + n] == token_item_[t] &&
           token_pos_[t + n] == token_pos_[t] + n) {
      ++n;
    }
    runs_.push_back({t, n});
    t += n;
  }
  const int64_t units = static_cast<int64_t>(runs_.size()) * kvh;
  // Causal work grows with position: each part takes every num_parts-th unit,
  // and threads claim parts as they free up.
  const int threads = pool_ != nullptr ? pool_->num_threads() : 1;
  const int64_t num_parts = std::min<int64_t>(units, 4 * threads);
  auto work = [&](int64_t begin, int64_t end) {
    for (int64_t part = begin; part < end; ++part) {
      for (int64_t u = part; u < units; u += num_parts) {
        const auto [t, n] = runs_[u / kvh];
        const int64_t g = u % kvh;
        const int64_t i = token_item_[t];
        PagedKvView kv{k_blocks[i * kvh + g], v_blocks[i * kvh + g],
                       layer.block_size, 1, c.head_dim};
        const int64_t offset = t * q_dim + g * group * c.head_dim;
        PagedAttention(q_.data() + offset, n, token_pos_[t], group_shape, kv,
                       attn_.data() + offset, isa_);
      }
    }
  };
  if (pool_ != nullptr) {
    pool_->ParallelFor(num_parts, work);
  } else {
    work(0, num_parts);
  }
}

}  // namespace baton
