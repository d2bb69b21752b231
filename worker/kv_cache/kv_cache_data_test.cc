// KV data paths of KvCache: write/read, the documented byte layout, layer
// export/import between pools, and layout checks.
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/float16.h"
#include "worker/kv_cache/kv_cache.h"
#include "worker/kv_cache/kv_layout.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

KvCacheOptions Options(DType dtype, int64_t num_blocks) {
  KvCacheOptions options;
  options.num_layers = 3;
  options.num_kv_heads = 3;
  options.head_dim = 5;
  options.block_size = 4;
  options.num_blocks = num_blocks;
  options.dtype = dtype;
  return options;
}

std::unique_ptr<KvCache> MakeCache(const KvCacheOptions& options) {
  absl::StatusOr<std::unique_ptr<KvCache>> cache = KvCache::Create(options);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return cache.ok() ? std::move(cache).value() : nullptr;
}

void ExpectConsistent(const KvCache& cache,
                      const std::vector<const BlockTable*>& tables) {
  EXPECT_EQ(cache.num_blocks_free() + cache.num_blocks_used(),
            cache.num_blocks_total());
  absl::Status s = cache.CheckInvariants(tables);
  EXPECT_TRUE(s.ok()) << s;
}

// [num_layers][num_tokens][kv_dim] values; some beyond F16's range and
// precision.
std::vector<float> RandomValues(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = normal(rng);
  if (count > 4) {
    values[0] = 1e-6f;     // F16 subnormal
    values[1] = 70000.0f;  // F16 overflow -> inf
    values[2] = -0.0f;
    values[3] = 1.0f + 1.0f / 4096.0f;  // ties / rounding
  }
  return values;
}

float Stored(float x, DType dtype) {
  return dtype == DType::kF32 ? x : F16ToF32(F32ToF16(x));
}

class KvDataTest : public ::testing::TestWithParam<DType> {};

TEST_P(KvDataTest, WriteThenReadBackAndView) {
  const DType dtype = GetParam();
  std::unique_ptr<KvCache> cache = MakeCache(Options(dtype, 16));
  ASSERT_NE(cache, nullptr);
  const KvLayout& layout = cache->layout();
  const int64_t kv_dim = layout.kv_dim();
  BlockTable other, table;
  ASSERT_TRUE(cache->Reserve(other, 5).ok());  // so table's ids start at 2
  const int64_t tokens = 11;
  ASSERT_TRUE(cache->Reserve(table, tokens).ok());
  std::vector<float> k = RandomValues(layout.num_layers * tokens * kv_dim, 1);
  std::vector<float> v = RandomValues(layout.num_layers * tokens * kv_dim, 2);
  for (int64_t l = 0; l < layout.num_layers; ++l) {
    const size_t off = static_cast<size_t>(l * tokens * kv_dim);
    if (l == 0) {  // token by token, reversed order
      for (int64_t t = tokens - 1; t >= 0; --t) {
        cache->WriteKv(table, l, t, &k[off + t * kv_dim], &v[off + t * kv_dim]);
      }
    } else {
      cache->WriteKvRange(table, l, 0, tokens, &k[off], &v[off]);
    }
  }
  ASSERT_TRUE(cache->SetNumTokens(table, tokens).ok());

  std::vector<float> k_out(kv_dim), v_out(kv_dim);
  for (int64_t l = 0; l < layout.num_layers; ++l) {
    KvLayerView view = cache->LayerView(l);
    for (int64_t t = 0; t < tokens; ++t) {
      cache->ReadKv(table, l, t, k_out.data(), v_out.data());
      const int32_t block = table.block_ids()[t / layout.block_size];
      const int64_t slot = t % layout.block_size;
      for (int64_t i = 0; i < kv_dim; ++i) {
        const size_t src = static_cast<size_t>((l * tokens + t) * kv_dim + i);
        const int64_t h = i / layout.head_dim, d = i % layout.head_dim;
        const int64_t at = slot * layout.head_dim + d;
        // Bitwise equality (NaN-free inputs; -0.0 keeps its sign).
        EXPECT_EQ(std::bit_cast<uint32_t>(k_out[i]),
                  std::bit_cast<uint32_t>(Stored(k[src], dtype)));
        EXPECT_EQ(std::bit_cast<uint32_t>(v_out[i]),
                  std::bit_cast<uint32_t>(Stored(v[src], dtype)));
        if (dtype == DType::kF16) {
          EXPECT_EQ(view.Keys<uint16_t>(block, h)[at], F32ToF16(k[src]));
          EXPECT_EQ(view.Values<uint16_t>(block, h)[at], F32ToF16(v[src]));
        } else {
          EXPECT_EQ(view.Keys<float>(block, h)[at], k[src]);
          EXPECT_EQ(view.Values<float>(block, h)[at], v[src]);
        }
      }
    }
  }
  EXPECT_TRUE(std::isinf(Stored(70000.0f, dtype)) == (dtype == DType::kF16));
  cache->Free(other);
  cache->Free(table);
  ExpectConsistent(*cache, {});
}

// The formula documented in kv_layout.h, checked against WriteKv.
TEST_P(KvDataTest, ByteLayoutMatchesDocumentation) {
  const DType dtype = GetParam();
  std::unique_ptr<KvCache> cache = MakeCache(Options(dtype, 6));
  ASSERT_NE(cache, nullptr);
  const KvLayout& L = cache->layout();
  BlockTable table;
  ASSERT_TRUE(cache->Reserve(table, 6 * L.block_size).ok());
  std::vector<float> k(L.kv_dim()), v(L.kv_dim());
  for (int64_t l = 0; l < L.num_layers; ++l) {
    for (int64_t t = 0; t < 6 * L.block_size; ++t) {
      for (int64_t i = 0; i < L.kv_dim(); ++i) {
        k[i] = static_cast<float>((l * 1000 + t) * 100 + i);
        v[i] = -k[i];
      }
      cache->WriteKv(table, l, t, k.data(), v.data());
    }
  }
  const uint8_t* base = cache->LayerBlock(0, 0);
  const uint64_t half = L.half_chunk_bytes();
  for (int64_t l = 0; l < L.num_layers; ++l) {
    for (int64_t b = 0; b < 6; ++b) {
      for (int64_t kv = 0; kv < 2; ++kv) {
        for (int64_t h = 0; h < L.num_kv_heads; ++h) {
          for (int64_t t = 0; t < L.block_size; ++t) {
            for (int64_t d = 0; d < L.head_dim; ++d) {
              const uint64_t offset =
                  ((l * 6 + b) * 2 + kv) * half +
                  ((h * L.block_size + t) * L.head_dim + d) * L.element_bytes();
              float got;
              if (dtype == DType::kF32) {
                std::memcpy(&got, base + offset, 4);
              } else {
                uint16_t bits;
                std::memcpy(&bits, base + offset, 2);
                got = F16ToF32(bits);
              }
              // Block ids are 0..5 in order on a fresh pool.
              const int64_t token = b * L.block_size + t;
              const float want = static_cast<float>((l * 1000 + token) * 100 +
                                                    h * L.head_dim + d);
              EXPECT_EQ(got, Stored(kv == 0 ? want : -want, dtype));
            }
          }
        }
      }
    }
  }
  cache->Free(table);
  ExpectConsistent(*cache, {&table});
}

TEST_P(KvDataTest, ExportImportIntoDifferentPoolPreservesBytes) {
  const DType dtype = GetParam();
  std::unique_ptr<KvCache> sender = MakeCache(Options(dtype, 20));
  std::unique_ptr<KvCache> receiver = MakeCache(Options(dtype, 33));
  ASSERT_NE(sender, nullptr);
  ASSERT_NE(receiver, nullptr);
  ASSERT_TRUE(CheckLayoutMatches(receiver->layout(), sender->layout()).ok());
  const KvLayout& L = sender->layout();
  const int64_t tokens = 23;  // 5 full blocks + 3 tokens
  BlockTable src, filler, dst;
  ASSERT_TRUE(sender->Reserve(src, tokens).ok());
  ASSERT_TRUE(receiver->Reserve(filler, 29).ok());  // shifts dst's ids
  std::vector<float> k = RandomValues(L.num_layers * tokens * L.kv_dim(), 7);
  std::vector<float> v = RandomValues(L.num_layers * tokens * L.kv_dim(), 8);
  for (int64_t l = 0; l < L.num_layers; ++l) {
    const size_t off = static_cast<size_t>(l * tokens * L.kv_dim());
    sender->WriteKvRange(src, l, 0, tokens, &k[off], &v[off]);
  }
  ASSERT_TRUE(sender->SetNumTokens(src, tokens).ok());

  // The receiver reserves room for one generated token too.
  ASSERT_TRUE(receiver->Reserve(dst, tokens + 1).ok());
  EXPECT_NE(
      std::vector<int32_t>(src.block_ids().begin(), src.block_ids().end()),
      std::vector<int32_t>(dst.block_ids().begin(),
                           dst.block_ids().begin() + src.num_blocks()));
  EXPECT_EQ(sender->LayerBytes(src), 6 * sender->chunk_bytes());
  for (int64_t l = 0; l < L.num_layers; ++l) {
    std::vector<uint8_t> wire(sender->LayerBytes(src));
    ASSERT_TRUE(sender->ExportLayer(src, l, wire).ok());
    ASSERT_TRUE(receiver->ImportLayer(dst, l, tokens, wire).ok());
  }
  ASSERT_TRUE(receiver->SetNumTokens(dst, tokens).ok());
  EXPECT_EQ(receiver->LayerBytes(dst), sender->LayerBytes(src));

  std::vector<float> ks(L.kv_dim()), vs(L.kv_dim()), kr(L.kv_dim()),
      vr(L.kv_dim());
  for (int64_t l = 0; l < L.num_layers; ++l) {
    KvLayerView sv = sender->LayerView(l), rv = receiver->LayerView(l);
    for (int64_t t = 0; t < tokens; ++t) {
      sender->ReadKv(src, l, t, ks.data(), vs.data());
      receiver->ReadKv(dst, l, t, kr.data(), vr.data());
      EXPECT_EQ(0, std::memcmp(ks.data(), kr.data(), ks.size() * 4));
      EXPECT_EQ(0, std::memcmp(vs.data(), vr.data(), vs.size() * 4));
      const int64_t i = t / L.block_size;
      const uint64_t row = L.element_bytes() * L.head_dim;
      const uint64_t at = (t % L.block_size) * row;
      for (int64_t h = 0; h < L.num_kv_heads; ++h) {
        EXPECT_EQ(0, std::memcmp(sv.KeyBytes(src.block_ids()[i], h) + at,
                                 rv.KeyBytes(dst.block_ids()[i], h) + at, row));
        EXPECT_EQ(0,
                  std::memcmp(sv.ValueBytes(src.block_ids()[i], h) + at,
                              rv.ValueBytes(dst.block_ids()[i], h) + at, row));
      }
    }
  }
  sender->Free(src);
  receiver->Free(filler);
  receiver->Free(dst);
  ExpectConsistent(*sender, {});
  ExpectConsistent(*receiver, {});
}

INSTANTIATE_TEST_SUITE_P(Dtypes, KvDataTest,
                         ::testing::Values(DType::kF16, DType::kF32),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return info.param == DType::kF16 ? "F16" : "F32";
                         });

TEST(KvTransferTest, SizeAndRangeErrorsWriteNothing) {
  std::unique_ptr<KvCache> cache = MakeCache(Options(DType::kF16, 8));
  ASSERT_NE(cache, nullptr);
  BlockTable table;
  ASSERT_TRUE(cache->Reserve(table, 10).ok());  // 3 blocks of 4
  ASSERT_TRUE(cache->SetNumTokens(table, 6).ok());
  const uint64_t chunk = cache->chunk_bytes();  // 2 * 3 * 4 * 5 * 2 = 240
  EXPECT_EQ(chunk, 240u);
  EXPECT_EQ(cache->LayerBytes(table), 2 * chunk);

  std::vector<uint8_t> small(2 * chunk - 1);
  absl::Status s = cache->ExportLayer(table, 0, small);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("must be 480 bytes (2 blocks x 240), got 479"));
  std::vector<uint8_t> ok(2 * chunk);
  EXPECT_EQ(cache->ExportLayer(table, 3, ok).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cache->ExportLayer(table, -1, ok).message(),
              HasSubstr("layer must be in [0, 3), got -1"));

  std::vector<uint8_t> ones(3 * chunk, 0xAB);
  s = cache->ImportLayer(table, 1, 6, ones);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("6 tokens need 480 bytes (2 blocks x 240), got 720"));
  s = cache->ImportLayer(table, 1, 13, ones);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("num_tokens must be in [0, 12]"));
  EXPECT_EQ(cache->ImportLayer(table, 3, 12, ones).code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing was written: the fresh pool still reads as zeros.
  for (int32_t b : table.block_ids()) {
    for (int64_t l = 0; l < 3; ++l) {
      const uint8_t* p = cache->LayerBlock(l, b);
      for (uint64_t i = 0; i < chunk; ++i) ASSERT_EQ(p[i], 0) << l << " " << b;
    }
  }
  EXPECT_TRUE(cache->ImportLayer(table, 1, 12, ones).ok());
  EXPECT_EQ(cache->LayerBlock(1, table.block_ids()[2])[chunk - 1], 0xAB);
  EXPECT_EQ(cache->LayerBlock(0, table.block_ids()[2])[chunk - 1], 0);
  cache->Free(table);
  ExpectConsistent(*cache, {});
}

TEST(KvTransferTest, LayoutMismatchRejected) {
  const KvLayout mine{.num_layers = 30,
                      .num_kv_heads = 3,
                      .head_dim = 64,
                      .block_size = 16,
                      .dtype = DType::kF16};
  EXPECT_EQ(mine.ToString(),
            "KvLayout{layers=30, kv_heads=3, head_dim=64, block_size=16, "
            "dtype=F16, chunk_bytes=12288}");
  EXPECT_TRUE(mine.Validate().ok());
  EXPECT_TRUE(CheckLayoutMatches(mine, mine).ok());

  KvLayout other_model = mine;
  other_model.num_layers = 32;
  other_model.head_dim = 128;
  absl::Status s = CheckLayoutMatches(mine, other_model);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("num_layers 32 vs expected 30"));
  EXPECT_THAT(s.message(), HasSubstr("head_dim 128 vs expected 64"));
  EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("block_size 16")));

  KvLayout other_layout = mine;
  other_layout.block_size = 32;
  other_layout.dtype = DType::kF32;
  EXPECT_NE(other_layout, mine);
  s = CheckLayoutMatches(mine, other_layout);
  EXPECT_THAT(s.message(), HasSubstr("block_size 32 vs expected 16"));
  EXPECT_THAT(s.message(), HasSubstr("dtype F32 vs expected F16"));

  KvLayout garbage = mine;
  garbage.num_kv_heads = 0;
  EXPECT_THAT(garbage.Validate().message(),
              HasSubstr("num_kv_heads must be in [1, 1024], got 0"));
}

// Export + import of a 1024-token sequence of a 30-layer, 3 KV heads x 64
// model: prints the throughput (no time assertion), checks the bytes.
TEST(KvTransferTest, SmolLm2SizedSequenceTransfer) {
  KvCacheOptions options;
  options.num_layers = 30;
  options.num_kv_heads = 3;
  options.head_dim = 64;
  options.num_blocks = 80;
  std::unique_ptr<KvCache> sender = MakeCache(options);
  options.num_blocks = 100;
  std::unique_ptr<KvCache> receiver = MakeCache(options);
  ASSERT_NE(sender, nullptr);
  ASSERT_NE(receiver, nullptr);
  const int64_t tokens = 1024, kv_dim = 192;
  BlockTable src, dst, filler;
  ASSERT_TRUE(sender->Reserve(src, tokens).ok());
  ASSERT_TRUE(receiver->Reserve(filler, 100).ok());
  ASSERT_TRUE(receiver->Reserve(dst, tokens).ok());
  std::vector<float> k = RandomValues(tokens * kv_dim, 11);
  std::vector<float> v = RandomValues(tokens * kv_dim, 12);
  for (int64_t l = 0; l < 30; ++l) {
    sender->WriteKvRange(src, l, 0, tokens, k.data(), v.data());
  }
  ASSERT_TRUE(sender->SetNumTokens(src, tokens).ok());
  const uint64_t layer_bytes = sender->LayerBytes(src);
  EXPECT_EQ(layer_bytes, 64u * 12288u);
  std::vector<uint8_t> wire(30 * layer_bytes, 0);

  // Pass 0 lands in untouched receiver pages (page faults included);
  // pass 1 is the steady state.
  using Clock = std::chrono::steady_clock;
  const double mb = static_cast<double>(wire.size()) / 1e6;
  for (int pass = 0; pass < 2; ++pass) {
    const Clock::time_point t0 = Clock::now();
    for (int64_t l = 0; l < 30; ++l) {
      ASSERT_TRUE(sender
                      ->ExportLayer(src, l,
                                    std::span<uint8_t>(wire).subspan(
                                        l * layer_bytes, layer_bytes))
                      .ok());
    }
    const Clock::time_point t1 = Clock::now();
    for (int64_t l = 0; l < 30; ++l) {
      ASSERT_TRUE(receiver
                      ->ImportLayer(dst, l, tokens,
                                    std::span<const uint8_t>(wire).subspan(
                                        l * layer_bytes, layer_bytes))
                      .ok());
    }
    const Clock::time_point t2 = Clock::now();
    const double export_s = std::chrono::duration<double>(t1 - t0).count();
    const double import_s = std::chrono::duration<double>(t2 - t1).count();
    std::printf(
        "[kv transfer] pass %d, 1024 tokens x 30 layers = %.2f MB: export "
        "%.3f ms (%.2f GB/s), import %.3f ms (%.2f GB/s)\n",
        pass, mb, export_s * 1e3, mb / 1e3 / export_s, import_s * 1e3,
        mb / 1e3 / import_s);
  }
  ASSERT_TRUE(receiver->SetNumTokens(dst, tokens).ok());

  std::vector<uint8_t> again(layer_bytes);
  for (int64_t l = 0; l < 30; ++l) {
    ASSERT_TRUE(receiver->ExportLayer(dst, l, again).ok());
    EXPECT_EQ(0, std::memcmp(again.data(), wire.data() + l * layer_bytes,
                             layer_bytes))
        << "layer " << l;
  }
  sender->Free(src);
  receiver->Free(dst);
  receiver->Free(filler);
  ExpectConsistent(*sender, {});
  ExpectConsistent(*receiver, {});
}

}  // namespace
}  // namespace baton
