#include "kernels/cpu/paged_attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/float16.h"

namespace baton {
namespace {

// A sequence's cache in shuffled blocks, filled with random half values.
struct TestCache {
  TestCache(int64_t positions, int64_t kv_heads, int64_t head_dim,
            int64_t block_size, uint32_t seed)
      : kv_heads(kv_heads), head_dim(head_dim), block_size(block_size) {
    int64_t blocks = (positions + block_size - 1) / block_size;
    int64_t chunk = kv_heads * block_size * head_dim;
    storage.resize(2 * chunk * (blocks + 3));
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (uint16_t& x : storage) x = F32ToF16(normal(rng));
    std::vector<int64_t> ids(blocks + 3);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int64_t b = 0; b < blocks; ++b) {
      k.push_back(storage.data() + 2 * chunk * ids[b]);
      v.push_back(storage.data() + 2 * chunk * ids[b] + chunk);
    }
  }
  PagedKvView View() const {
    return PagedKvView{k, v, block_size, kv_heads, head_dim};
  }
  float K(int64_t pos, int64_t g, int64_t i) const {
    return F16ToF32(k[pos / block_size]
                     [(g * block_size + pos % block_size) * head_dim + i]);
  }
  float V(int64_t pos, int64_t g, int64_t i) const {
    return F16ToF32(v[pos / block_size]
                     [(g * block_size + pos % block_size) * head_dim + i]);
  }
  int64_t kv_heads, head_dim, block_size;
  std::vector<uint16_t> storage;
  std::vector<const uint16_t*> k, v;
};

std::vector<float> RandomQueries(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(n);
  for (float& x : q) x = normal(rng);
  return q;
}

// Double-precision reference for one (query, head).
std::vector<double> Reference(const TestCache& c, const float* q, int64_t pos,
                              int64_t g, float scale) {
  std::vector<double> s(pos + 1);
  double m = -INFINITY;
  for (int64_t j = 0; j <= pos; ++j) {
    double dot = 0;
    for (int64_t i = 0; i < c.head_dim; ++i) dot += double(q[i]) * c.K(j, g, i);
    s[j] = dot * scale;
    m = std::max(m, s[j]);
  }
  double sum = 0;
  for (double& x : s) sum += (x = std::exp(x - m));
  std::vector<double> out(c.head_dim, 0.0);
  for (int64_t j = 0; j <= pos; ++j) {
    for (int64_t i = 0; i < c.head_dim; ++i)
      out[i] += s[j] / sum * c.V(j, g, i);
  }
  return out;
}

struct Shape {
  int64_t heads, kv_heads, head_dim, block_size, start, queries;
};

class PagedAttentionTest : public ::testing::TestWithParam<Shape> {};

TEST_P(PagedAttentionTest, MatchesDoubleReferenceOnEveryPath) {
  const Shape p = GetParam();
  TestCache cache(p.start + p.queries, p.kv_heads, p.head_dim, p.block_size, 7);
  std::vector<float> q = RandomQueries(p.queries * p.heads * p.head_dim, 11);
  AttentionShape shape{p.heads, 1.0f / std::sqrt(float(p.head_dim))};
  for (CpuIsa isa : kAllCpuIsas) {
    if (!IsCpuIsaSupported(isa)) continue;
    std::vector<float> out(q.size(), NAN);
    PagedAttention(q.data(), p.queries, p.start, shape, cache.View(),
                   out.data(), isa);
    for (int64_t i = 0; i < p.queries; ++i) {
      for (int64_t h = 0; h < p.heads; ++h) {
        int64_t g = h / (p.heads / p.kv_heads);
        const float* qh = q.data() + (i * p.heads + h) * p.head_dim;
        std::vector<double> ref =
            Reference(cache, qh, p.start + i, g, shape.scale);
        for (int64_t d = 0; d < p.head_dim; ++d) {
          // Outputs are convex combinations of O(1) values; float error of
          // the dot products (~1e-6 relative), exp (2 ulp) and the sums
          // stays far below 1e-4.
          ASSERT_NEAR(out[(i * p.heads + h) * p.head_dim + d], ref[d], 1e-4)
              << CpuIsaName(isa) << " query " << i << " head " << h << " dim "
              << d;
        }
      }
    }
  }
}

// The cluster relies on this: a token's attention output must not depend on
// how its prompt was chunked (or whether it is a decode step).
TEST_P(PagedAttentionTest, BitIdenticalAcrossChunkings) {
  const Shape p = GetParam();
  TestCache cache(p.start + p.queries, p.kv_heads, p.head_dim, p.block_size, 3);
  std::vector<float> q = RandomQueries(p.queries * p.heads * p.head_dim, 5);
  AttentionShape shape{p.heads, 1.0f / std::sqrt(float(p.head_dim))};
  const int64_t row = p.heads * p.head_dim;
  for (CpuIsa isa : kAllCpuIsas) {
    if (!IsCpuIsaSupported(isa)) continue;
    std::vector<float> whole(q.size());
    PagedAttention(q.data(), p.queries, p.start, shape, cache.View(),
                   whole.data(), isa);
    for (int64_t chunk : {int64_t{1}, int64_t{3}, int64_t{16}}) {
      std::vector<float> pieces(q.size());
      for (int64_t i = 0; i < p.queries; i += chunk) {
        int64_t n = std::min(chunk, p.queries - i);
        PagedAttention(q.data() + i * row, n, p.start + i, shape, cache.View(),
                       pieces.data() + i * row, isa);
      }
      ASSERT_EQ(0, std::memcmp(whole.data(), pieces.data(),
                               whole.size() * sizeof(float)))
          << CpuIsaName(isa) << " chunk " << chunk;
    }
  }
}

// What the engine does: one KV head's slice of the queries
// (shape.query_stride = every head's row), in runs of kAttentionQueryTile
// queries, against a view of that head alone; the same bits as the dense
// call over every head.
TEST_P(PagedAttentionTest, KvHeadSlicesWithQueryStrideMatchTheDenseCall) {
  const Shape p = GetParam();
  TestCache cache(p.start + p.queries, p.kv_heads, p.head_dim, p.block_size, 4);
  std::vector<float> q = RandomQueries(p.queries * p.heads * p.head_dim, 8);
  const float scale = 1.0f / std::sqrt(float(p.head_dim));
  const int64_t row = p.heads * p.head_dim;
  const int64_t group = p.heads / p.kv_heads;
  const int64_t head_elems = p.block_size * p.head_dim;
  for (CpuIsa isa : kAllCpuIsas) {
    if (!IsCpuIsaSupported(isa)) continue;
    std::vector<float> dense(q.size());
    PagedAttention(q.data(), p.queries, p.start, {p.heads, scale}, cache.View(),
                   dense.data(), isa);
    std::vector<float> sliced(q.size(), NAN);
    for (int64_t g = 0; g < p.kv_heads; ++g) {
      std::vector<const uint16_t*> k, v;
      for (size_t b = 0; b < cache.k.size(); ++b) {
        k.push_back(cache.k[b] + g * head_elems);
        v.push_back(cache.v[b] + g * head_elems);
      }
      const PagedKvView view{k, v, p.block_size, 1, p.head_dim};
      for (int64_t i = 0; i < p.queries; i += kAttentionQueryTile) {
        const int64_t n = std::min(kAttentionQueryTile, p.queries - i);
        const int64_t offset = i * row + g * group * p.head_dim;
        PagedAttention(q.data() + offset, n, p.start + i, {group, scale, row},
                       view, sliced.data() + offset, isa);
      }
    }
    ASSERT_EQ(0, std::memcmp(dense.data(), sliced.data(),
                             dense.size() * sizeof(float)))
        << CpuIsaName(isa);
  }
}

// Every path this CPU has gives the scalar path's bits (head_dim a multiple
// of 16: one score order for all; other head dims run the scalar path on
// every ISA), so a request keeps its tokens across hosts with different CPUs.
TEST_P(PagedAttentionTest, BitIdenticalAcrossIsaPaths) {
  const Shape p = GetParam();
  TestCache cache(p.start + p.queries, p.kv_heads, p.head_dim, p.block_size, 9);
  std::vector<float> q = RandomQueries(p.queries * p.heads * p.head_dim, 13);
  AttentionShape shape{p.heads, 1.0f / std::sqrt(float(p.head_dim))};
  std::vector<float> scalar(q.size());
  PagedAttention(q.data(), p.queries, p.start, shape, cache.View(),
                 scalar.data(), CpuIsa::kScalar);
  int paths = 0;
  for (CpuIsa isa : kAllCpuIsas) {
    if (isa == CpuIsa::kScalar || !IsCpuIsaSupported(isa)) continue;
    ++paths;
    std::vector<float> out(q.size(), NAN);
    PagedAttention(q.data(), p.queries, p.start, shape, cache.View(),
                   out.data(), isa);
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(out[i]),
                std::bit_cast<uint32_t>(scalar[i]))
          << CpuIsaName(isa) << " element " << i << ": " << out[i]
          << " vs scalar " << scalar[i];
    }
  }
  std::printf("paged attention: %d vector path(s) compared with scalar\n",
              paths);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PagedAttentionTest,
    ::testing::Values(Shape{9, 3, 64, 16, 0, 1}, Shape{9, 3, 64, 16, 0, 37},
                      Shape{9, 3, 64, 16, 50, 19}, Shape{4, 4, 32, 8, 7, 9},
                      Shape{8, 1, 128, 16, 100, 3}, Shape{6, 2, 24, 4, 3, 5},
                      Shape{32, 8, 128, 16, 300, 2},
                      Shape{16, 1, 256, 16, 20, 21},
                      // head_dim 80 and 96: 10 and 12 AVX2 registers a row
                      // (a chunk of 8, then the rest); 16 and 48: one chunk
                      // under 8.
                      Shape{10, 2, 80, 16, 40, 3}, Shape{8, 2, 96, 16, 33, 2},
                      Shape{4, 1, 48, 16, 20, 5}, Shape{2, 1, 16, 16, 17, 2}));

}  // namespace
}  // namespace baton
