// The CPU attention kernel's paths, shared by paged_attention.cc (the scalar
// path and the dispatch) and the per-ISA files (paged_attention_avx2.cc,
// paged_attention_avx512.cc). Every path gives the same bits.
#ifndef BATON_KERNELS_CPU_PAGED_ATTENTION_INTERNAL_H_
#define BATON_KERNELS_CPU_PAGED_ATTENTION_INTERNAL_H_

#include <cstdint>

#include "kernels/cpu/exp_approx.h"
#include "kernels/cpu/paged_attention.h"

namespace baton::attention_internal {

constexpr int kMaxGroup = 16;  // query heads per KV head
// The SIMD paths take the heads of up to kTileQueries queries at once (one
// KV head's rows of a prefill chunk share every K and V row they read).
constexpr int kTileQueries = static_cast<int>(kAttentionQueryTile);
constexpr int kMaxRows = kTileQueries * kMaxGroup;

// The softmax's exp (exp_approx.h, degree 6): arguments are <= 0.
inline float ExpNonPositive(float x) { return exp_approx::Exp<6>(x); }

// The softmax's denominator, the n exps of a row summed in double in an
// order every path shares: eight partial sums, lane l adding s[8k + l] for
// k = 0, 1, ... over the whole groups of eight; then the lanes in a fixed
// tree, ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)); then the last n % 8 one
// by one. The SIMD paths hold the lanes in registers (one 8-lane register of
// doubles on AVX-512, two of 4 on AVX2) and give the same bits.
inline double LanesTree8(const double* lane) {
  const double t0 = lane[0] + lane[4], t1 = lane[1] + lane[5];
  const double t2 = lane[2] + lane[6], t3 = lane[3] + lane[7];
  return (t0 + t2) + (t1 + t3);
}

// The lanes' tree, then s[j .. n - 1] one by one (j: the end of the
// whole groups of eight).
inline double FinishSumExps(const double* lane, const float* s, int64_t j,
                            int64_t n) {
  double sum = LanesTree8(lane);
  for (; j < n; ++j) sum += s[j];
  return sum;
}

inline double SumExps(const float* s, int64_t n) {
  double lane[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int l = 0; l < 8; ++l) lane[l] += s[j + l];
  }
  return FinishSumExps(lane, s, j, n);
}

// The attention of `rows` query rows of one KV head g (the heads of up to
// kTileQueries queries), row r over keys [0, n_keys[r]): qh[r] its query,
// oh[r] its output, `scores` room for rows x max(n_keys) floats.
using GroupFn = void (*)(const float* const* qh, float* const* oh,
                         const int64_t* n_keys, int rows, const PagedKvView& kv,
                         int64_t g, float scale, float* scores);

#if defined(__x86_64__)
// The SIMD paths for head_dim = 16 NV (NV <= 16); null for other sizes.
GroupFn GroupAvx512For(int64_t head_dim);
GroupFn GroupAvx2For(int64_t head_dim);
#endif

}  // namespace baton::attention_internal

#endif  // BATON_KERNELS_CPU_PAGED_ATTENTION_INTERNAL_H_
