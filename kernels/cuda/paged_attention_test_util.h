// What the paged attention kernel tests share: a host image of a device KV
// pool (worker/kv_cache/kv_layout.h, F16) filled with seeded random halves,
// shuffled non-contiguous block tables, the CPU reference
// (kernels/cpu/paged_attention.h) over that image, and the test configs.
#ifndef BATON_KERNELS_CUDA_PAGED_ATTENTION_TEST_UTIL_H_
#define BATON_KERNELS_CUDA_PAGED_ATTENTION_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kernels/cpu/float16.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cuda/paged_attention.h"

namespace baton::cuda_test {

// Tolerance of both kernels against the CPU kernel, |got - ref| <= kAtol +
// kRtol |ref|. Both compute in float32 over the same half K/V; they differ in
// summation order, exp implementation (exp2f vs a polynomial, each within
// 2 ulp) and where the scale is applied. With K, V, q ~ N(0, 1) and scale
// 1/sqrt(head_dim) the logits are O(1) and out is a convex combination of V
// values (|v| < 5): the worst-case float32 accumulation error over 2049 keys
// is about 2049 * 2^-24 * 5 = 6e-4, the typical one 1e-5, while an indexing
// or masking bug moves outputs by O(0.1).
inline constexpr double kAtol = 1e-3;
inline constexpr double kRtol = 1e-3;

// One attention geometry under test.
struct AttentionConfig {
  int64_t head_dim = 64;
  int64_t block_size = 16;
  int64_t num_heads = 9;
  int64_t num_kv_heads = 3;

  float scale() const { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }
  // "d64_bs16_h9kv3".
  std::string Name() const {
    return "d" + std::to_string(head_dim) + "_bs" + std::to_string(block_size) +
           "_h" + std::to_string(num_heads) + "kv" +
           std::to_string(num_kv_heads);
  }
};

// gtest prints a config by its name.
inline void PrintTo(const AttentionConfig& config, std::ostream* os) {
  *os << config.Name();
}

// head_dim 64/128 x block size 16/32 x GQA ratio 3, 1, 4, plus Llama-3's
// 32 heads over 8 KV heads.
inline std::vector<AttentionConfig> AllConfigs() {
  std::vector<AttentionConfig> configs;
  for (int64_t d : {64, 128}) {
    for (int64_t bs : {16, 32}) {
      configs.push_back({d, bs, 9, 3});
      configs.push_back({d, bs, 4, 4});
      configs.push_back({d, bs, 8, 2});
    }
  }
  configs.push_back({128, 16, 32, 8});
  return configs;
}

inline std::vector<float> RandomNormal(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// Host image of a pool of num_layers x num_blocks chunks (K then V, each
// [num_kv_heads][block_size][head_dim] halves), every half ~ N(0, 1).
class HostKvPool {
 public:
  HostKvPool(int64_t num_layers, int64_t num_blocks,
             const AttentionConfig& config, uint32_t seed)
      : num_blocks_(num_blocks),
        config_(config),
        half_chunk_(config.num_kv_heads * config.block_size * config.head_dim) {
    data_.resize(num_layers * num_blocks * 2 * half_chunk_);
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (uint16_t& x : data_) x = F32ToF16(normal(rng));
  }

  std::span<const uint16_t> data() const { return data_; }
  int64_t num_blocks() const { return num_blocks_; }

  // The device view of `layer` for a pool uploaded to `device_pool`.
  cuda::PagedKvPoolView DeviceView(const uint16_t* device_pool,
                                   int64_t layer) const {
    return cuda::PagedKvPoolView{device_pool,      layer,
                                 num_blocks_,      config_.num_kv_heads,
                                 config_.head_dim, config_.block_size};
  }

  // out = PagedAttention on the CPU for one sequence whose blocks (in token
  // order) are `row`, with q, out [num_queries][num_heads][head_dim].
  void Reference(int64_t layer, std::span<const int32_t> row, const float* q,
                 int64_t num_queries, int64_t start_pos, float* out) const {
    std::vector<const uint16_t*> k;
    std::vector<const uint16_t*> v;
    for (int32_t b : row) {
      const uint16_t* chunk =
          data_.data() + (layer * num_blocks_ + b) * 2 * half_chunk_;
      k.push_back(chunk);
      v.push_back(chunk + half_chunk_);
    }
    const PagedKvView view{k, v, config_.block_size, config_.num_kv_heads,
                           config_.head_dim};
    const AttentionShape shape{config_.num_heads, config_.scale()};
    PagedAttention(q, num_queries, start_pos, shape, view, out);
  }

 private:
  int64_t num_blocks_;
  AttentionConfig config_;
  int64_t half_chunk_;
  std::vector<uint16_t> data_;
};

// Concatenated block tables: sequence s owns ids[offsets[s], offsets[s + 1]).
struct HostBlockTables {
  std::vector<int32_t> ids;
  std::vector<int32_t> offsets{0};

  std::span<const int32_t> Row(size_t s) const {
    return std::span<const int32_t>(ids).subspan(offsets[s],
                                                 offsets[s + 1] - offsets[s]);
  }
};

inline int64_t BlocksFor(int64_t context_len, int64_t block_size) {
  return (context_len + block_size - 1) / block_size;
}

// Distinct block ids, drawn from a shuffled permutation of [0, num_blocks),
// for sequences of the given context lengths (so no row is contiguous or
// ordered). REQUIRES: num_blocks >= the total number of blocks needed.
inline HostBlockTables ShuffledTables(std::span<const int64_t> context_lens,
                                      int64_t block_size, int64_t num_blocks,
                                      uint32_t seed) {
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  HostBlockTables tables;
  size_t next = 0;
  for (int64_t ctx : context_lens) {
    for (int64_t b = 0; b < BlocksFor(ctx, block_size); ++b) {
      tables.ids.push_back(perm.at(next++));
    }
    tables.offsets.push_back(static_cast<int32_t>(tables.ids.size()));
  }
  return tables;
}

// Blocks needed by these contexts plus spare ones no table uses.
inline int64_t PoolBlocksFor(std::span<const int64_t> context_lens,
                             int64_t block_size) {
  int64_t total = 0;
  for (int64_t ctx : context_lens) total += BlocksFor(ctx, block_size);
  return total + total / 4 + 3;
}

inline void PrintKernelError(const std::string& op, const std::string& what,
                             double max_abs) {
  std::printf("BATON_KERNEL_ERROR op=%s case=%s max_abs=%g atol=%g rtol=%g\n",
              op.c_str(), what.c_str(), max_abs, kAtol, kRtol);
}

// Every element is the 0xFFFFFFFF pattern DeviceBuffer::Poison leaves.
inline bool AllPoison(std::span<const float> values) {
  return std::all_of(values.begin(), values.end(), [](float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    return bits == 0xffffffffu;
  });
}

}  // namespace baton::cuda_test

#endif  // BATON_KERNELS_CUDA_PAGED_ATTENTION_TEST_UTIL_H_
