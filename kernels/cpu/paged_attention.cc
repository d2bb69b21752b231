#include "kernels/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/check.h"
#include "kernels/cpu/float16.h"
#include "kernels/cpu/paged_attention_internal.h"

namespace baton {
namespace {

using attention_internal::ExpNonPositive;
using attention_internal::GroupFn;
using attention_internal::kMaxGroup;
using attention_internal::kMaxRows;
using attention_internal::kTileQueries;
using attention_internal::SumExps;

// The score order every path shares for head_dim a multiple of 16: 16
// lanes, lane l summing q[16 c + l] k[16 c + l] over c (a product, then
// fused multiply-adds), then a fixed tree: lanes l + 8 and l, then l + 4 and
// l, then 2 and 0 with 3 and 1, then those two. The AVX-512 path holds the
// lanes in one register, the AVX2 path in two, this one in an array; all
// three give the same bits.
inline float Reduce16(const float* lane) {
  float t[8], u[4];
  for (int l = 0; l < 8; ++l) t[l] = lane[l + 8] + lane[l];
  for (int l = 0; l < 4; ++l) u[l] = t[l + 4] + t[l];
  return (u[2] + u[0]) + (u[3] + u[1]);
}

inline float Dot16Lanes(const float* q, const uint16_t* k, int64_t d) {
  float lane[16];
  for (int l = 0; l < 16; ++l) lane[l] = q[l] * F16ToF32(k[l]);
  for (int64_t c = 16; c < d; c += 16) {
    for (int l = 0; l < 16; ++l)
      lane[l] = std::fma(q[c + l], F16ToF32(k[c + l]), lane[l]);
  }
  return Reduce16(lane);
}

// Attention for the heads of one KV group and one query position, scalar.
void GroupScalar(const float* const* qh, float* const* oh, int group,
                 int64_t n_keys, const PagedKvView& kv, int64_t g, float scale,
                 float* scores) {
  const int64_t d = kv.head_dim;
  const int64_t bs = kv.block_size;
  const int64_t head_stride = bs * d;
  for (int64_t j = 0; j < n_keys; ++j) {
    const uint16_t* k = kv.k_blocks[j / bs] + g * head_stride + (j % bs) * d;
    for (int h = 0; h < group; ++h) {
      float acc = 0.0f;
      if (d % 16 == 0) {
        acc = Dot16Lanes(qh[h], k, d);
      } else {
        for (int64_t i = 0; i < d; ++i)
          acc = std::fma(qh[h][i], F16ToF32(k[i]), acc);
      }
      scores[h * n_keys + j] = acc * scale;
    }
  }
  for (int h = 0; h < group; ++h) {
    float* s = scores + h * n_keys;
    float m = *std::max_element(s, s + n_keys);
    for (int64_t j = 0; j < n_keys; ++j) s[j] = ExpNonPositive(s[j] - m);
    const float inv = static_cast<float>(1.0 / SumExps(s, n_keys));
    for (int64_t i = 0; i < d; ++i) oh[h][i] = 0.0f;
    for (int64_t j = 0; j < n_keys; ++j) {
      const uint16_t* v = kv.v_blocks[j / bs] + g * head_stride + (j % bs) * d;
      const float p = s[j] * inv;
      for (int64_t i = 0; i < d; ++i)
        oh[h][i] = std::fma(p, F16ToF32(v[i]), oh[h][i]);
    }
  }
}

}  // namespace

void PagedAttention(const float* q, int64_t num_queries, int64_t start_pos,
                    const AttentionShape& shape, const PagedKvView& kv,
                    float* out, CpuIsa isa) {
  BATON_CHECK_GT(kv.num_kv_heads, 0);
  BATON_CHECK_EQ(shape.num_heads % kv.num_kv_heads, 0);
  const int group = static_cast<int>(shape.num_heads / kv.num_kv_heads);
  BATON_CHECK_LE(group, kMaxGroup);
  const int64_t d = kv.head_dim;
  const int64_t row = shape.num_heads * d;
  BATON_CHECK(shape.query_stride == 0 || shape.query_stride >= row)
      << "PagedAttention: query_stride " << shape.query_stride
      << " is below num_heads * head_dim = " << row;
  const int64_t stride = shape.query_stride > 0 ? shape.query_stride : row;
  const int64_t max_keys = start_pos + num_queries;
  BATON_CHECK_LE((max_keys + kv.block_size - 1) / kv.block_size,
                 static_cast<int64_t>(kv.k_blocks.size()));
  thread_local std::vector<float> scratch;  // [rows][n_keys] scores
  scratch.resize(static_cast<size_t>(kTileQueries * group * max_keys));
  float* scores = scratch.data();
  const bool lanes16 = d % 16 == 0 && d <= 256;
  GroupFn simd = nullptr;
#if defined(__x86_64__)
  if ((isa == CpuIsa::kAvx512 || isa == CpuIsa::kAvx512Vnni) && lanes16) {
    simd = attention_internal::GroupAvx512For(d);
  } else if (isa == CpuIsa::kAvx2 && lanes16) {
    simd = attention_internal::GroupAvx2For(d);
  }
#endif
  const float* qh[kMaxRows];
  float* oh[kMaxRows];
  int64_t n_keys[kMaxRows];
  if (simd != nullptr) {
    // The heads of kTileQueries queries of one KV head at a time.
    for (int64_t g = 0; g < kv.num_kv_heads; ++g) {
      for (int64_t i0 = 0; i0 < num_queries; i0 += kTileQueries) {
        const int64_t queries =
            std::min<int64_t>(kTileQueries, num_queries - i0);
        int rows = 0;
        for (int64_t i = i0; i < i0 + queries; ++i) {
          for (int h = 0; h < group; ++h, ++rows) {
            const int64_t head = g * group + h;
            qh[rows] = q + i * stride + head * d;
            oh[rows] = out + i * stride + head * d;
            n_keys[rows] = start_pos + i + 1;
          }
        }
        simd(qh, oh, n_keys, rows, kv, g, shape.scale, scores);
      }
    }
    return;
  }
  for (int64_t i = 0; i < num_queries; ++i) {
    for (int64_t g = 0; g < kv.num_kv_heads; ++g) {
      for (int h = 0; h < group; ++h) {
        const int64_t head = g * group + h;
        qh[h] = q + i * stride + head * d;
        oh[h] = out + i * stride + head * d;
      }
      GroupScalar(qh, oh, group, start_pos + i + 1, kv, g, shape.scale, scores);
    }
  }
}

}  // namespace baton
