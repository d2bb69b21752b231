// The AVX-512 MatMul kernels, compiled twice: with VNNI (vpdpbusd, one
// instruction per 64 byte products) by matmul_avx512.cc, and without it
// (vpmaddubsw + vpmaddwd) by matmul_avx512bw.cc for Skylake-X class CPUs.
// Tiles of up to 4 rows x 4 tokens, two weight blocks per 512-bit register.
// The integer dot products are exact either way, so both give the same bits.
// Reduction order: see matmul_kernels.h.
//
// The including file defines BATON_AVX512_VNNI (0 or 1) and
// BATON_AVX512_KERNELS (the KernelTable function this defines).
#ifndef BATON_KERNELS_CPU_MATMUL_AVX512_IMPL_H_
#define BATON_KERNELS_CPU_MATMUL_AVX512_IMPL_H_

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

#include <cstring>
#include <vector>

#if BATON_AVX512_VNNI
#define BATON_AVX512                                          \
  __attribute__((                                             \
      target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma," \
             "f16c")))
#else
#define BATON_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#endif

namespace baton::matmul_internal {
namespace {

// Tile loops must unroll fully so the accumulators live in registers.
#define BATON_UNROLL _Pragma("GCC unroll 16")

constexpr int kTileRows = 4;
constexpr int kTileTokens = 4;

// Per 32-bit lane: the four products of unsigned bytes of u and signed bytes
// of s, summed. Without VNNI the pairs are summed in 16 bits first, so the
// callers keep every pair sum within int16 (weight codes 0-31 here).
BATON_AVX512 inline __m512i DotU8S8(__m512i u, __m512i s) {
#if BATON_AVX512_VNNI
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
#else
  return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
#endif
}

BATON_AVX512 inline float Hsum(__m512 v) {
  const __m256 lo = _mm512_castps512_ps256(v);
  const __m256 hi =
      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  const __m256 h8 = _mm256_add_ps(lo, hi);
  const __m128 h4 =
      _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
  const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
  return _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)));
}

// Lanes 0-7 = *f0, lanes 8-15 = *f1 (broadcast loads, no shuffles).
BATON_AVX512 inline __m512 SplitBroadcast(const float* f0, const float* f1) {
  return _mm512_mask_broadcastss_ps(_mm512_set1_ps(*f0), 0xff00,
                                    _mm_load_ss(f1));
}

// Activation scales of blocks (b, b+1), or (b, 0) when b is the last block.
BATON_AVX512 inline __m512 ActScales(const float* da, bool two) {
  return two ? SplitBroadcast(da, da + 1)
             : _mm512_maskz_broadcastss_ps(0x00ff, _mm_load_ss(da));
}

// 64 activation bytes of blocks (b, b+1); the upper 32 are zero if !two.
BATON_AVX512 inline __m512i ActQuants(const int8_t* q, bool two) {
  return two ? _mm512_loadu_si512(q) : _mm512_maskz_loadu_epi64(0x0f, q);
}

// Weight codes of blocks (b, b+1) in activation order (low nibbles of qs0,
// high nibbles of qs0, then qs1's); qs1 may be null (zeros).
BATON_AVX512 inline __m512i UnpackQ4Pair(const uint8_t* qs0,
                                         const uint8_t* qs1) {
  __m512i x = _mm512_broadcast_i32x4(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs0)));
  if (qs1 != nullptr) {
    x = _mm512_mask_broadcast_i32x4(
        x, 0xff00, _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs1)));
  }
  x = _mm512_mask_srli_epi16(x, 0xff00ff00, x, 4);
  x = _mm512_and_si512(x, _mm512_set1_epi8(0x0f));
  return qs1 != nullptr ? x : _mm512_maskz_mov_epi64(0x0f, x);
}

// Per row, per block pair p: dm[4p..4p+3] = {d0, m0, d1, m1} and
// mc[b] = m of block b (m = -8 d for Q4_0); a missing block 2p+1 is zeros.
template <typename L>
BATON_AVX512 void PrepQ4(const uint8_t* w, int64_t row_bytes, int rows,
                         int64_t nb, float* dm, float* mc) {
  const int64_t npairs = (nb + 1) / 2;
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = w + r * row_bytes;
    float* dmr = dm + r * npairs * 4;
    float* mcr = mc + r * nb;
    int64_t p = 0;
    if constexpr (L::kF32Scales) {    // Q4_K_R, Q5_K_R: {d, m} opens a block
      for (; 2 * p + 2 <= nb; ++p) {  // a pair: two 8-byte loads
        const uint8_t* b0 = row + 2 * p * L::kBlockBytes;
        const __m128 dm0 =
            _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(b0)));
        const __m128 both = _mm_loadh_pi(
            dm0, reinterpret_cast<const __m64*>(b0 + L::kBlockBytes));
        _mm_storeu_ps(dmr + 4 * p, both);  // d0 m0 d1 m1
        _mm_storel_pi(reinterpret_cast<__m64*>(mcr + 2 * p),
                      _mm_shuffle_ps(both, both, _MM_SHUFFLE(3, 1, 3, 1)));
      }
      for (int64_t b = 2 * p; b < nb; ++b) {
        const float d = BlockScale<L>(row + b * L::kBlockBytes, 0);
        const float m = BlockScale<L>(row + b * L::kBlockBytes, 1);
        dmr[2 * b] = d;
        dmr[2 * b + 1] = m;
        mcr[b] = m;
      }
      if (nb % 2 != 0) {
        dmr[2 * nb] = 0.0f;
        dmr[2 * nb + 1] = 0.0f;
      }
      continue;
    }
    for (; 2 * p + 8 <= nb; p += 4) {  // eight blocks at a time
      const uint8_t* first = row + 2 * p * L::kBlockBytes;
      const __m256 d = BlockHalfs8<L::kBlockBytes, 0>(first);
      __m256 m;
      if constexpr (L::kHasMin) {
        m = BlockHalfs8<L::kBlockBytes, 2>(first);
      } else {
        m = _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
      }
      // {d0, m0, d1, m1 | d4, m4, d5, m5} and {d2, m2, d3, m3 | d6, ...}.
      const __m256 lo = _mm256_unpacklo_ps(d, m);
      const __m256 hi = _mm256_unpackhi_ps(d, m);
      _mm256_storeu_ps(dmr + 4 * p, _mm256_permute2f128_ps(lo, hi, 0x20));
      _mm256_storeu_ps(dmr + 4 * p + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
      _mm256_storeu_ps(mcr + 2 * p, m);
    }
    for (; p < npairs; ++p) {
      const uint8_t* b0 = row + 2 * p * L::kBlockBytes;
      const bool two = 2 * p + 1 < nb;
      uint32_t h0 = 0, h1 = 0;
      std::memcpy(&h0, b0, L::kHasMin ? 4 : 2);
      if (two) std::memcpy(&h1, b0 + L::kBlockBytes, L::kHasMin ? 4 : 2);
      __m128 f = _mm_cvtph_ps(
          _mm_setr_epi32(static_cast<int>(h0), static_cast<int>(h1), 0, 0));
      if constexpr (!L::kHasMin) {
        f = _mm_mul_ps(_mm_moveldup_ps(f),
                       _mm_setr_ps(1.0f, -8.0f, 1.0f, -8.0f));
      }
      _mm_storeu_ps(dmr + 4 * p, f);
      alignas(16) float tmp[4];
      _mm_store_ps(tmp, f);
      mcr[2 * p] = tmp[1];
      if (two) mcr[2 * p + 1] = tmp[3];
    }
  }
}

struct TileCtx {
  const uint8_t* w;
  int64_t row_bytes;
  const Q8Activations* x;
  int64_t nb;
  float* y;
  int64_t ldy;
};

// Pointers of one tile: weight rows, their prepared scales, and tokens.
template <int R, int T>
struct TilePtrs {
  const uint8_t* w[R];
  const float* dm[R];
  const int8_t* qa[T];
  const float* da[T];
};

template <int R, int T>
BATON_AVX512 inline TilePtrs<R, T> MakePtrs(const TileCtx& c, const uint8_t* w,
                                            const float* dm, int64_t dm_stride,
                                            int64_t t0) {
  TilePtrs<R, T> p;
  BATON_UNROLL
  for (int r = 0; r < R; ++r) {
    p.w[r] = w + r * c.row_bytes;
    p.dm[r] = dm + r * dm_stride;
  }
  BATON_UNROLL
  for (int t = 0; t < T; ++t) {
    p.qa[t] = c.x->quants(t0 + t);
    p.da[t] = c.x->scales(t0 + t);
  }
  return p;
}

// Blocks (2p, 2p+1), or only 2p when !kTwo (the odd last block).
template <typename L, int R, int T, bool kTwo>
BATON_AVX512 __attribute__((always_inline)) inline void Q4Step(
    const TilePtrs<R, T>& tp, int64_t p, __m512 (&acc)[R][T]) {
  const int64_t b = 2 * p;
  __m512i wv[R];
  __m512 dw[R];
  BATON_UNROLL
  for (int r = 0; r < R; ++r) {
    const uint8_t* blk = tp.w[r] + b * L::kBlockBytes;
    if constexpr (L::kByteCodes) {  // Q5_K_R: 32 code bytes a block
      const __m256i w0 = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(blk + L::kQsOffset));
      wv[r] = kTwo ? _mm512_mask_broadcast_i64x4(
                         _mm512_castsi256_si512(w0), 0xf0,
                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                             blk + L::kBlockBytes + L::kQsOffset)))
                   : _mm512_zextsi256_si512(w0);
    } else {
      wv[r] =
          UnpackQ4Pair(blk + L::kQsOffset,
                       kTwo ? blk + L::kBlockBytes + L::kQsOffset : nullptr);
    }
    dw[r] = SplitBroadcast(tp.dm[r] + 4 * p, tp.dm[r] + 4 * p + 2);
  }
  BATON_UNROLL
  for (int t = 0; t < T; ++t) {
    const __m512i av = ActQuants(tp.qa[t] + b * 32, kTwo);
    const __m512 da = ActScales(tp.da[t] + b, kTwo);
    BATON_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m512i s = DotU8S8(wv[r], av);
      acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s),
                                  _mm512_mul_ps(dw[r], da), acc[r][t]);
    }
  }
}

template <typename L, int R, int T>
BATON_AVX512 void Q4Tile(const TileCtx& c, const uint8_t* w, const float* dm,
                         const float* mc, int64_t t0, float* y) {
  const int64_t nb = c.nb;
  const int64_t npairs = (nb + 1) / 2;
  const TilePtrs<R, T> tp = MakePtrs<R, T>(c, w, dm, npairs * 4, t0);
  __m512 acc[R][T];
  BATON_UNROLL
  for (int r = 0; r < R; ++r) BATON_UNROLL
  for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t p = 0; p < nb / 2; ++p) Q4Step<L, R, T, true>(tp, p, acc);
  if (nb & 1) Q4Step<L, R, T, false>(tp, nb / 2, acc);
  const __mmask16 tail = static_cast<__mmask16>((1u << (nb % 16)) - 1);
  BATON_UNROLL
  for (int r = 0; r < R; ++r) {
    BATON_UNROLL
    for (int t = 0; t < T; ++t) {
      const float* sa = c.x->sums(t0 + t);
      const float* m = mc + r * nb;
      __m512 accm = _mm512_setzero_ps();
      int64_t b = 0;
      for (; b + 16 <= nb; b += 16) {
        accm = _mm512_fmadd_ps(_mm512_loadu_ps(m + b), _mm512_loadu_ps(sa + b),
                               accm);
      }
      if (b < nb) {
        accm = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, m + b),
                               _mm512_maskz_loadu_ps(tail, sa + b), accm);
      }
      y[(t0 + t) * c.ldy + r] = Hsum(_mm512_add_ps(acc[r][t], accm));
    }
  }
}

// The kernels of weights with int8 codes (Q8_0, Q6_K_R).
#include "kernels/cpu/matmul_avx512_q8.h"  // NOLINT(build/include): a part

using TileFn = void (*)(const TileCtx&, const uint8_t*, const float*,
                        const float*, int64_t, float*);
using PrepFn = void (*)(const uint8_t*, int64_t, int, int64_t, float*, float*);

#define BATON_TILE_ROW(F, R) \
  { &F<R, 1>, &F<R, 2>, &F<R, 3>, &F<R, 4> }
#define BATON_TILE_TABLE(F)                                           \
  {                                                                   \
    BATON_TILE_ROW(F, 1), BATON_TILE_ROW(F, 2), BATON_TILE_ROW(F, 3), \
        BATON_TILE_ROW(F, 4)                                          \
  }

template <int R, int T>
BATON_AVX512 void Q4_0Tile(const TileCtx& c, const uint8_t* w, const float* dm,
                           const float* mc, int64_t t0, float* y) {
  Q4Tile<Q4_0Layout, R, T>(c, w, dm, mc, t0, y);
}
template <int R, int T>
BATON_AVX512 void Q4_1Tile(const TileCtx& c, const uint8_t* w, const float* dm,
                           const float* mc, int64_t t0, float* y) {
  Q4Tile<Q4_1Layout, R, T>(c, w, dm, mc, t0, y);
}
template <int R, int T>
BATON_AVX512 void Q5_KRTile(const TileCtx& c, const uint8_t* w, const float* dm,
                            const float* mc, int64_t t0, float* y) {
  Q4Tile<Q5_KRLayout, R, T>(c, w, dm, mc, t0, y);
}
template <int R, int T>
BATON_AVX512 void Q4_KRTile(const TileCtx& c, const uint8_t* w, const float* dm,
                            const float* mc, int64_t t0, float* y) {
  Q4Tile<Q4_KRLayout, R, T>(c, w, dm, mc, t0, y);
}

constexpr TileFn kQ4_0Tiles[4][4] = BATON_TILE_TABLE(Q4_0Tile);
constexpr TileFn kQ4_1Tiles[4][4] = BATON_TILE_TABLE(Q4_1Tile);
constexpr TileFn kQ4_KRTiles[4][4] = BATON_TILE_TABLE(Q4_KRTile);
constexpr TileFn kQ5_KRTiles[4][4] = BATON_TILE_TABLE(Q5_KRTile);
constexpr TileFn kQ8_0Tiles[4][4] = BATON_TILE_TABLE(Q8Tile);
constexpr TileFn kQ6_KRTiles[4][4] = BATON_TILE_TABLE(Q6_KRTile);

// Row tiles outermost so each tile's weights stay in L1 across the tokens.
void QuantRows(const QuantArgs& a, const TileFn (&tiles)[4][4], PrepFn prep) {
  const int64_t nb = a.x->blocks_per_token();
  const int64_t npairs = (nb + 1) / 2;
  thread_local std::vector<float> scratch;
  scratch.resize(kTileRows * (npairs * 4 + nb));
  float* dm = scratch.data();
  float* mc = dm + kTileRows * npairs * 4;
  const TileCtx ctx{a.w, a.row_bytes, a.x, nb, a.y, a.ldy};
  for (int64_t r0 = 0; r0 < a.nrows; r0 += kTileRows) {
    const int rows =
        static_cast<int>(std::min<int64_t>(kTileRows, a.nrows - r0));
    const uint8_t* w = a.w + r0 * a.row_bytes;
    prep(w, a.row_bytes, rows, nb, dm, mc);
    for (int64_t t0 = a.t_begin; t0 < a.t_end; t0 += kTileTokens) {
      const int toks =
          static_cast<int>(std::min<int64_t>(kTileTokens, a.t_end - t0));
      tiles[rows - 1][toks - 1](ctx, w, dm, mc, t0, a.y + r0);
    }
  }
}

void Q4_0Rows(const QuantArgs& a) {
  QuantRows(a, kQ4_0Tiles, &PrepQ4<Q4_0Layout>);
}
void Q4_1Rows(const QuantArgs& a) {
  QuantRows(a, kQ4_1Tiles, &PrepQ4<Q4_1Layout>);
}
void Q4_KRRows(const QuantArgs& a) {
  QuantRows(a, kQ4_KRTiles, &PrepQ4<Q4_KRLayout>);
}
void Q5_KRRows(const QuantArgs& a) {
  QuantRows(a, kQ5_KRTiles, &PrepQ4<Q5_KRLayout>);
}
void Q8_0Rows(const QuantArgs& a) { QuantRows(a, kQ8_0Tiles, &PrepQ8); }
void Q6_KRRows(const QuantArgs& a) { QuantRows(a, kQ6_KRTiles, &PrepQ6_KR); }

template <bool kF16, int R, int T>
BATON_AVX512 void FloatTile(const FloatArgs& a, int64_t r0, int64_t t0) {
  __m512 acc[R][T];
  BATON_UNROLL
  for (int r = 0; r < R; ++r) BATON_UNROLL
  for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  const uint8_t* w = a.w + r0 * a.row_bytes;
  for (int64_t i = 0; i < a.k; i += 16) {
    __m512 wv[R];
    BATON_UNROLL
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = w + r * a.row_bytes;
      if constexpr (kF16) {
        wv[r] = _mm512_cvtph_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i)));
      } else {
        wv[r] = _mm512_loadu_ps(reinterpret_cast<const float*>(p + 4 * i));
      }
    }
    BATON_UNROLL
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_loadu_ps(a.x + (t0 + t) * a.k + i);
      BATON_UNROLL
      for (int r = 0; r < R; ++r)
        acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  BATON_UNROLL
  for (int r = 0; r < R; ++r) BATON_UNROLL
  for (int t = 0; t < T; ++t) a.y[(t0 + t) * a.ldy + r0 + r] = Hsum(acc[r][t]);
}

using FloatTileFn = void (*)(const FloatArgs&, int64_t, int64_t);
template <int R, int T>
BATON_AVX512 void F32Tile(const FloatArgs& a, int64_t r0, int64_t t0) {
  FloatTile<false, R, T>(a, r0, t0);
}
template <int R, int T>
BATON_AVX512 void F16Tile(const FloatArgs& a, int64_t r0, int64_t t0) {
  FloatTile<true, R, T>(a, r0, t0);
}
constexpr FloatTileFn kF32Tiles[4][4] = BATON_TILE_TABLE(F32Tile);
constexpr FloatTileFn kF16Tiles[4][4] = BATON_TILE_TABLE(F16Tile);

void FloatRows(const FloatArgs& a, const FloatTileFn (&tiles)[4][4]) {
  for (int64_t r0 = 0; r0 < a.nrows; r0 += kTileRows) {
    const int rows =
        static_cast<int>(std::min<int64_t>(kTileRows, a.nrows - r0));
    for (int64_t t0 = a.t_begin; t0 < a.t_end; t0 += kTileTokens) {
      const int toks =
          static_cast<int>(std::min<int64_t>(kTileTokens, a.t_end - t0));
      tiles[rows - 1][toks - 1](a, r0, t0);
    }
  }
}

void F32Rows(const FloatArgs& a) { FloatRows(a, kF32Tiles); }
void F16Rows(const FloatArgs& a) { FloatRows(a, kF16Tiles); }

}  // namespace

const KernelTable& BATON_AVX512_KERNELS() {
  static constexpr KernelTable kTable = {&Q4_0Rows,  &Q4_1Rows,  &Q8_0Rows,
                                         &Q4_KRRows, &Q6_KRRows, &Q5_KRRows,
                                         &F32Rows,   &F16Rows};
  return kTable;
}

}  // namespace baton::matmul_internal

#else  // !defined(__x86_64__)

namespace baton::matmul_internal {
const KernelTable& BATON_AVX512_KERNELS() { return ScalarKernels(); }
}  // namespace baton::matmul_internal

#endif

#endif  // BATON_KERNELS_CPU_MATMUL_AVX512_IMPL_H_
