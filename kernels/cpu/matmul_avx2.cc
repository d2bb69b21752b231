// AVX2 MatMul kernels: quantized weights in tiles of up to 2 rows x 4
// tokens (f32/f16 weights: 2 x 2), one weight block per 256-bit
// maddubs/madd, the 16 accumulator lanes held as two 8-lane halves.
// Reduction order: see matmul_kernels.h.
//
// Lanes 0-7 take the even blocks and lanes 8-15 the odd ones, so a tile of
// more than four outputs sums the even blocks first and then the odd ones:
// each lane still sees its blocks in order (the same bits), and only one
// half of the accumulators, R x T registers, is in use at a time (the even
// half waits in memory during the odd pass). Sixteen (two halves of 2 x 4)
// would not fit AVX2's sixteen registers beside the weights and
// activations; eight leave room, and each weight block unpacked serves four
// tokens instead of two.
#include "kernels/cpu/matmul_halfs.h"
#include "kernels/cpu/matmul_kernels.h"

#if defined(__x86_64__)

#include <immintrin.h>

// GCC 12 flags the _mm512_undefined_* placeholders inside its own
// intrinsics as (maybe-)uninitialized once they are inlined here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <algorithm>
#include <cstring>
#include <vector>

#define BATON_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace baton::matmul_internal {
namespace {

// Tile loops must unroll fully so the accumulators live in registers.
#define BATON_UNROLL _Pragma("GCC unroll 16")

constexpr int kTileRows = 2;
constexpr int kTileTokens = 4;

// Hsum16 of the lanes (lo[0..7], hi[0..7]).
BATON_AVX2 inline float Hsum(__m256 lo, __m256 hi) {
  const __m256 h8 = _mm256_add_ps(lo, hi);
  const __m128 h4 =
      _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
  const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
  return _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)));
}

// Lane j = sum of products of bytes 4j..4j+3 (u8 x s8, no saturation for
// |u| <= 128, |s| <= 127).
BATON_AVX2 inline __m256i Dot4(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

BATON_AVX2 inline __m256i UnpackQ4(const uint8_t* qs) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m),
                          _mm_and_si128(x, m));
}

BATON_AVX2 inline __m256i LoadQ8(const uint8_t* qs) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
}

// Per row: d[b] and mc[b] (min, -8 d for Q4_0, unused for Q8_0), eight
// blocks at a time.
// kMode: 0 = Q4_0, 1 = Q4_1, 2 = Q8_0, 3 = Q4_K_R (f32 d and m), 4 = Q6_K_R
// (nothing: AddBlock reads each block's two f32 scales itself), 5 = Q5_K_R
// (as 3; its codes are bytes, not nibbles).
template <int kBlockBytes, int kMode>
BATON_AVX2 void Prep(const uint8_t* w, int64_t row_bytes, int rows, int64_t nb,
                     float* d, float* mc) {
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = w + r * row_bytes;
    if constexpr (kMode == 4) continue;  // AddBlock reads the block's scales
    float* dr = d + r * nb;
    float* mr = mc + r * nb;
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
      const uint8_t* first = row + b * kBlockBytes;
      if constexpr (kMode == 3 || kMode == 5) {
        // {d, m, ...} of four blocks at a time, transposed with shuffles
        // (gathers cost as much as the tile's own work on some cores).
        for (int h = 0; h < 8; h += 4) {
          const uint8_t* q = first + h * kBlockBytes;
          const __m128 b0 = _mm_loadu_ps(reinterpret_cast<const float*>(q));
          const __m128 b1 =
              _mm_loadu_ps(reinterpret_cast<const float*>(q + kBlockBytes));
          const __m128 b2 =
              _mm_loadu_ps(reinterpret_cast<const float*>(q + 2 * kBlockBytes));
          const __m128 b3 =
              _mm_loadu_ps(reinterpret_cast<const float*>(q + 3 * kBlockBytes));
          const __m128 lo = _mm_unpacklo_ps(b0, b1);  // d0 d1 m0 m1
          const __m128 hi = _mm_unpacklo_ps(b2, b3);  // d2 d3 m2 m3
          _mm_storeu_ps(dr + b + h, _mm_movelh_ps(lo, hi));
          _mm_storeu_ps(mr + b + h, _mm_movehl_ps(hi, lo));
        }
        continue;
      }
      const __m256 db = BlockHalfs8<kBlockBytes, 0>(first);
      _mm256_storeu_ps(dr + b, db);
      if constexpr (kMode == 0) {
        _mm256_storeu_ps(mr + b, _mm256_mul_ps(_mm256_set1_ps(-8.0f), db));
      }
      if constexpr (kMode == 1) {
        _mm256_storeu_ps(mr + b, BlockHalfs8<kBlockBytes, 2>(first));
      }
    }
    for (; b < nb; ++b) {
      if constexpr (kMode == 3 || kMode == 5) {
        std::memcpy(dr + b, row + b * kBlockBytes, sizeof(float));
        std::memcpy(mr + b, row + b * kBlockBytes + 4, sizeof(float));
        continue;
      }
      uint16_t h[2];
      std::memcpy(h, row + b * kBlockBytes, kMode == 1 ? 4 : 2);
      const float db = _cvtsh_ss(h[0]);
      dr[b] = db;
      if constexpr (kMode == 0) mr[b] = -8.0f * db;
      if constexpr (kMode == 1) mr[b] = _cvtsh_ss(h[1]);
    }
  }
}

struct TileCtx {
  const uint8_t* w;
  int64_t row_bytes;
  const Q8Activations* x;
  int64_t nb;
  int64_t ldy;
};

// Block b of rows [0, R) times tokens [t0, t0 + T), into acc[r][t]. kMode
// as in Prep; kQsOffset is where the codes start inside a block.
template <int kBlockBytes, int kQsOffset, int kMode, int R, int T>
BATON_AVX2 inline void AddBlock(const TileCtx& c, const uint8_t* w,
                                const float* d, int64_t t0, int64_t b,
                                __m256 (&acc)[R][T]) {
  const int64_t nb = c.nb;
  __m256i wv[R];
  __m256 dw[R];
  BATON_UNROLL
  for (int r = 0; r < R; ++r) {
    const uint8_t* qs = w + r * c.row_bytes + b * kBlockBytes + kQsOffset;
    if constexpr (kMode == 2 || kMode == 4 || kMode == 5) {
      wv[r] = LoadQ8(qs);
    } else {
      wv[r] = UnpackQ4(qs);
    }
    if constexpr (kMode == 4) {
      const auto* sc = reinterpret_cast<const float*>(qs - kQsOffset);
      dw[r] = _mm256_set_m128(_mm_broadcast_ss(sc + 1), _mm_broadcast_ss(sc));
    } else {
      dw[r] = _mm256_set1_ps(d[r * nb + b]);
    }
  }
  BATON_UNROLL
  for (int t = 0; t < T; ++t) {
    const __m256i av = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(c.x->quants(t0 + t) + b * 32));
    const __m256 da = _mm256_set1_ps(c.x->scales(t0 + t)[b]);
    BATON_UNROLL
    for (int r = 0; r < R; ++r) {
      __m256i s;
      if constexpr (kMode == 2 || kMode == 4) {
        s = Dot4(_mm256_abs_epi8(wv[r]), _mm256_sign_epi8(av, wv[r]));
      } else {
        s = Dot4(wv[r], av);
      }
      acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s),
                                  _mm256_mul_ps(dw[r], da), acc[r][t]);
    }
  }
}

template <int kBlockBytes, int kQsOffset, int kMode, int R, int T>
BATON_AVX2 void QuantTile(const TileCtx& c, const uint8_t* w, const float* d,
                          const float* mc, int64_t t0, float* y) {
  const int64_t nb = c.nb;
  __m256 acc[2][R][T];
  BATON_UNROLL
  for (int h = 0; h < 2; ++h) BATON_UNROLL
  for (int r = 0; r < R; ++r) BATON_UNROLL
  for (int t = 0; t < T; ++t) acc[h][r][t] = _mm256_setzero_ps();
  if constexpr (R * T <= 4) {
    for (int64_t b = 0; b < nb; ++b) {
      AddBlock<kBlockBytes, kQsOffset, kMode, R, T>(c, w, d, t0, b, acc[b & 1]);
    }
  } else {
    for (int64_t b = 0; b < nb; b += 2) {
      AddBlock<kBlockBytes, kQsOffset, kMode, R, T>(c, w, d, t0, b, acc[0]);
    }
    for (int64_t b = 1; b < nb; b += 2) {
      AddBlock<kBlockBytes, kQsOffset, kMode, R, T>(c, w, d, t0, b, acc[1]);
    }
  }
  BATON_UNROLL
  for (int r = 0; r < R; ++r) {
    BATON_UNROLL
    for (int t = 0; t < T; ++t) {
      __m256 lo = acc[0][r][t], hi = acc[1][r][t];
      if constexpr (kMode != 2 && kMode != 4) {
        const float* sa = c.x->sums(t0 + t);
        __m256 ml = _mm256_setzero_ps(), mh = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b += 16) {
          const int64_t left = nb - b;
          const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
          const __m256i kl = _mm256_cmpgt_epi32(
              _mm256_set1_epi32(static_cast<int>(std::min<int64_t>(left, 16))),
              lane);
          const __m256i kh = _mm256_cmpgt_epi32(
              _mm256_set1_epi32(static_cast<int>(std::min<int64_t>(left, 16)) -
                                8),
              lane);
          const float* m = mc + r * nb + b;
          ml = _mm256_fmadd_ps(_mm256_maskload_ps(m, kl),
                               _mm256_maskload_ps(sa + b, kl), ml);
          mh = _mm256_fmadd_ps(_mm256_maskload_ps(m + 8, kh),
                               _mm256_maskload_ps(sa + b + 8, kh), mh);
        }
        lo = _mm256_add_ps(lo, ml);
        hi = _mm256_add_ps(hi, mh);
      }
      y[(t0 + t) * c.ldy + r] = Hsum(lo, hi);
    }
  }
}

using TileFn = void (*)(const TileCtx&, const uint8_t*, const float*,
                        const float*, int64_t, float*);
using PrepFn = void (*)(const uint8_t*, int64_t, int, int64_t, float*, float*);

template <int R, int T>
BATON_AVX2 void Q4_0Tile(const TileCtx& c, const uint8_t* w, const float* d,
                         const float* mc, int64_t t0, float* y) {
  QuantTile<Q4_0Layout::kBlockBytes, Q4_0Layout::kQsOffset, 0, R, T>(c, w, d,
                                                                     mc, t0, y);
}
template <int R, int T>
BATON_AVX2 void Q4_1Tile(const TileCtx& c, const uint8_t* w, const float* d,
                         const float* mc, int64_t t0, float* y) {
  QuantTile<Q4_1Layout::kBlockBytes, Q4_1Layout::kQsOffset, 1, R, T>(c, w, d,
                                                                     mc, t0, y);
}
template <int R, int T>
BATON_AVX2 void Q4_KRTile(const TileCtx& c, const uint8_t* w, const float* d,
                          const float* mc, int64_t t0, float* y) {
  QuantTile<Q4_KRLayout::kBlockBytes, Q4_KRLayout::kQsOffset, 1, R, T>(
      c, w, d, mc, t0, y);
}
template <int R, int T>
BATON_AVX2 void Q5_KRTile(const TileCtx& c, const uint8_t* w, const float* d,
                          const float* mc, int64_t t0, float* y) {
  QuantTile<Q5_KRLayout::kBlockBytes, Q5_KRLayout::kQsOffset, 5, R, T>(
      c, w, d, mc, t0, y);
}
template <int R, int T>
BATON_AVX2 void Q6_KRTile(const TileCtx& c, const uint8_t* w, const float* d,
                          const float* mc, int64_t t0, float* y) {
  QuantTile<kQ6_KRBlockBytes, kQ6_KRQsOffset, 4, R, T>(c, w, d, mc, t0, y);
}
template <int R, int T>
BATON_AVX2 void Q8_0Tile(const TileCtx& c, const uint8_t* w, const float* d,
                         const float* mc, int64_t t0, float* y) {
  QuantTile<kQ8_0BlockBytes, 2, 2, R, T>(c, w, d, mc, t0, y);
}

#define BATON_TILE_TABLE(F)                     \
  {                                             \
    {&F<1, 1>, &F<1, 2>, &F<1, 3>, &F<1, 4>}, { \
      &F<2, 1>, &F<2, 2>, &F<2, 3>, &F<2, 4>    \
    }                                           \
  }
constexpr TileFn kQ4_0Tiles[kTileRows][kTileTokens] =
    BATON_TILE_TABLE(Q4_0Tile);
constexpr TileFn kQ4_1Tiles[kTileRows][kTileTokens] =
    BATON_TILE_TABLE(Q4_1Tile);
constexpr TileFn kQ8_0Tiles[kTileRows][kTileTokens] =
    BATON_TILE_TABLE(Q8_0Tile);
constexpr TileFn kQ4_KRTiles[kTileRows][kTileTokens] =
    BATON_TILE_TABLE(Q4_KRTile);
constexpr TileFn kQ6_KRTiles[kTileRows][kTileTokens] =
    BATON_TILE_TABLE(Q6_KRTile);
constexpr TileFn kQ5_KRTiles[kTileRows][kTileTokens] =
    BATON_TILE_TABLE(Q5_KRTile);

void QuantRows(const QuantArgs& a,
               const TileFn (&tiles)[kTileRows][kTileTokens], PrepFn prep) {
  const int64_t nb = a.x->blocks_per_token();
  thread_local std::vector<float> scratch;
  scratch.resize(2 * kTileRows * nb);
  float* d = scratch.data();
  float* mc = d + kTileRows * nb;
  const TileCtx ctx{a.w, a.row_bytes, a.x, nb, a.ldy};
  for (int64_t r0 = 0; r0 < a.nrows; r0 += kTileRows) {
    const int rows =
        static_cast<int>(std::min<int64_t>(kTileRows, a.nrows - r0));
    const uint8_t* w = a.w + r0 * a.row_bytes;
    prep(w, a.row_bytes, rows, nb, d, mc);
    for (int64_t t0 = a.t_begin; t0 < a.t_end; t0 += kTileTokens) {
      const int toks =
          static_cast<int>(std::min<int64_t>(kTileTokens, a.t_end - t0));
      tiles[rows - 1][toks - 1](ctx, w, d, mc, t0, a.y + r0);
    }
  }
}

void Q4_0Rows(const QuantArgs& a) {
  QuantRows(a, kQ4_0Tiles, &Prep<Q4_0Layout::kBlockBytes, 0>);
}
void Q4_1Rows(const QuantArgs& a) {
  QuantRows(a, kQ4_1Tiles, &Prep<Q4_1Layout::kBlockBytes, 1>);
}
void Q8_0Rows(const QuantArgs& a) {
  QuantRows(a, kQ8_0Tiles, &Prep<kQ8_0BlockBytes, 2>);
}
void Q4_KRRows(const QuantArgs& a) {
  QuantRows(a, kQ4_KRTiles, &Prep<Q4_KRLayout::kBlockBytes, 3>);
}
void Q6_KRRows(const QuantArgs& a) {
  QuantRows(a, kQ6_KRTiles, &Prep<kQ6_KRBlockBytes, 4>);
}
void Q5_KRRows(const QuantArgs& a) {
  QuantRows(a, kQ5_KRTiles, &Prep<Q5_KRLayout::kBlockBytes, 5>);
}

template <bool kF16>
BATON_AVX2 inline __m256 LoadW8(const uint8_t* row, int64_t i) {
  if constexpr (kF16) {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i)));
  } else {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row + 4 * i));
  }
}

template <bool kF16, int R, int T>
BATON_AVX2 void FloatTile(const FloatArgs& a, int64_t r0, int64_t t0) {
  __m256 lo[R][T], hi[R][T];
  BATON_UNROLL
  for (int r = 0; r < R; ++r) BATON_UNROLL
  for (int t = 0; t < T; ++t) lo[r][t] = hi[r][t] = _mm256_setzero_ps();
  const uint8_t* w = a.w + r0 * a.row_bytes;
  for (int64_t i = 0; i < a.k; i += 16) {
    __m256 wl[R], wh[R];
    BATON_UNROLL
    for (int r = 0; r < R; ++r) {
      wl[r] = LoadW8<kF16>(w + r * a.row_bytes, i);
      wh[r] = LoadW8<kF16>(w + r * a.row_bytes, i + 8);
    }
    BATON_UNROLL
    for (int t = 0; t < T; ++t) {
      const float* x = a.x + (t0 + t) * a.k + i;
      const __m256 xl = _mm256_loadu_ps(x), xh = _mm256_loadu_ps(x + 8);
      BATON_UNROLL
      for (int r = 0; r < R; ++r) {
        lo[r][t] = _mm256_fmadd_ps(wl[r], xl, lo[r][t]);
        hi[r][t] = _mm256_fmadd_ps(wh[r], xh, hi[r][t]);
      }
    }
  }
  BATON_UNROLL
  for (int r = 0; r < R; ++r) BATON_UNROLL
  for (int t = 0; t < T; ++t)
    a.y[(t0 + t) * a.ldy + r0 + r] = Hsum(lo[r][t], hi[r][t]);
}

using FloatTileFn = void (*)(const FloatArgs&, int64_t, int64_t);
template <int R, int T>
BATON_AVX2 void F32Tile(const FloatArgs& a, int64_t r0, int64_t t0) {
  FloatTile<false, R, T>(a, r0, t0);
}
template <int R, int T>
BATON_AVX2 void F16Tile(const FloatArgs& a, int64_t r0, int64_t t0) {
  FloatTile<true, R, T>(a, r0, t0);
}
#define BATON_FLOAT_TILE_TABLE(F)                \
  {                                              \
    {&F<1, 1>, &F<1, 2>}, { &F<2, 1>, &F<2, 2> } \
  }
constexpr int kFloatTileTokens = 2;
constexpr FloatTileFn kF32Tiles[kTileRows][kFloatTileTokens] =
    BATON_FLOAT_TILE_TABLE(F32Tile);
constexpr FloatTileFn kF16Tiles[kTileRows][kFloatTileTokens] =
    BATON_FLOAT_TILE_TABLE(F16Tile);

void FloatRows(const FloatArgs& a,
               const FloatTileFn (&tiles)[kTileRows][kFloatTileTokens]) {
  for (int64_t r0 = 0; r0 < a.nrows; r0 += kTileRows) {
    const int rows =
        static_cast<int>(std::min<int64_t>(kTileRows, a.nrows - r0));
    for (int64_t t0 = a.t_begin; t0 < a.t_end; t0 += kFloatTileTokens) {
      const int toks =
          static_cast<int>(std::min<int64_t>(kFloatTileTokens, a.t_end - t0));
      tiles[rows - 1][toks - 1](a, r0, t0);
    }
  }
}

void F32Rows(const FloatArgs& a) { FloatRows(a, kF32Tiles); }
void F16Rows(const FloatArgs& a) { FloatRows(a, kF16Tiles); }

}  // namespace

const KernelTable& Avx2Kernels() {
  static constexpr KernelTable kTable = {&Q4_0Rows,  &Q4_1Rows,  &Q8_0Rows,
                                         &Q4_KRRows, &Q6_KRRows, &Q5_KRRows,
                                         &F32Rows,   &F16Rows};
  return kTable;
}

}  // namespace baton::matmul_internal

#else  // !defined(__x86_64__)

namespace baton::matmul_internal {
const KernelTable& Avx2Kernels() { return ScalarKernels(); }
}  // namespace baton::matmul_internal

#endif
