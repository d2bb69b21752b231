// Part of matmul_avx512_impl.h, included inside its namespace after the
// shared tile helpers (TileCtx, TilePtrs, MakePtrs, the activation loads):
// the kernels of weights with int8 codes, Q8_0 and Q6_K_R. Not a header of
// its own; compiled once per variant of the including file.
#ifndef BATON_KERNELS_CPU_MATMUL_AVX512_Q8_H_
#define BATON_KERNELS_CPU_MATMUL_AVX512_Q8_H_

// Q8_0 (kHalfScales false: dm[2p..2p+1] = d of blocks 2p, 2p+1) and Q6_K_R
// (kHalfScales: dm[4p..4p+3] = the half-block scales s0, s1 of block 2p,
// then of block 2p+1).
template <int kBlockBytes, int kQsOffset, bool kHalfScales>
struct Q8Format {
  static constexpr int kBytes = kBlockBytes;
  static constexpr int kQs = kQsOffset;
  static constexpr bool kHalf = kHalfScales;
  static constexpr int kScalesPerPair = kHalfScales ? 4 : 2;
};
using Q8_0Format = Q8Format<kQ8_0BlockBytes, 2, false>;
using Q6_KRFormat = Q8Format<kQ6_KRBlockBytes, kQ6_KRQsOffset, true>;

template <typename F, int R, int T, bool kTwo>
BATON_AVX512 __attribute__((always_inline)) inline void Q8Step(
    const TilePtrs<R, T>& tp, int64_t p, __m512 (&acc)[R][T]) {
  const int64_t b = 2 * p;
#if BATON_AVX512_VNNI
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
#endif
  __m512i wv[R], init[R];
  __m512 dw[R];
  BATON_UNROLL
  for (int r = 0; r < R; ++r) {
    const uint8_t* blk = tp.w[r] + b * F::kBytes;
    const __m256i w0 =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + F::kQs));
    wv[r] = kTwo ? _mm512_mask_broadcast_i64x4(
                       _mm512_castsi256_si512(w0), 0xf0,
                       _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                           blk + F::kBytes + F::kQs)))
                 : _mm512_zextsi256_si512(w0);
#if BATON_AVX512_VNNI
    // (qa + 128) . qw - 128 * sum(qw) = qa . qw, with qa + 128 unsigned.
    init[r] = _mm512_sub_epi32(
        _mm512_setzero_si512(),
        _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, wv[r]));
#else
    init[r] = _mm512_setzero_si512();
#endif
    if constexpr (F::kHalf) {
      // Lanes 4h..4h+3 take scale h of {s0, s1 of 2p, s0, s1 of 2p + 1}.
      dw[r] = _mm512_permutexvar_ps(
          _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
          _mm512_castps128_ps512(_mm_loadu_ps(tp.dm[r] + 4 * p)));
    } else {
      dw[r] = SplitBroadcast(tp.dm[r] + 2 * p, tp.dm[r] + 2 * p + 1);
    }
  }
  BATON_UNROLL
  for (int t = 0; t < T; ++t) {
#if BATON_AVX512_VNNI
    const __m512i av =
        _mm512_xor_si512(ActQuants(tp.qa[t] + b * 32, kTwo), bias);
#else
    const __m512i av = ActQuants(tp.qa[t] + b * 32, kTwo);
#endif
    const __m512 da = ActScales(tp.da[t] + b, kTwo);
    BATON_UNROLL
    for (int r = 0; r < R; ++r) {
#if BATON_AVX512_VNNI
      const __m512i s = _mm512_dpbusd_epi32(init[r], av, wv[r]);
#else
      // qa . qw = |qw| . (qa with qw's sign): |qw| <= 128 unsigned, |qa| <=
      // 127, so each pair sum fits int16.
      const __m512i signed_a = _mm512_mask_sub_epi8(
          av, _mm512_movepi8_mask(wv[r]), _mm512_setzero_si512(), av);
      const __m512i s =
          _mm512_add_epi32(init[r], DotU8S8(_mm512_abs_epi8(wv[r]), signed_a));
#endif
      acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s),
                                  _mm512_mul_ps(dw[r], da), acc[r][t]);
    }
  }
}

template <typename F, int R, int T>
BATON_AVX512 void Q8TileOf(const TileCtx& c, const uint8_t* w, const float* dm,
                           int64_t t0, float* y) {
  const int64_t nb = c.nb;
  const int64_t npairs = (nb + 1) / 2;
  const TilePtrs<R, T> tp =
      MakePtrs<R, T>(c, w, dm, npairs * F::kScalesPerPair, t0);
  __m512 acc[R][T];
  BATON_UNROLL
  for (int r = 0; r < R; ++r) BATON_UNROLL
  for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t p = 0; p < nb / 2; ++p) Q8Step<F, R, T, true>(tp, p, acc);
  if (nb & 1) Q8Step<F, R, T, false>(tp, nb / 2, acc);
  BATON_UNROLL
  for (int r = 0; r < R; ++r) BATON_UNROLL
  for (int t = 0; t < T; ++t) y[(t0 + t) * c.ldy + r] = Hsum(acc[r][t]);
}

template <int R, int T>
BATON_AVX512 void Q8Tile(const TileCtx& c, const uint8_t* w, const float* dm,
                         const float* /*unused*/, int64_t t0, float* y) {
  Q8TileOf<Q8_0Format, R, T>(c, w, dm, t0, y);
}
template <int R, int T>
BATON_AVX512 void Q6_KRTile(const TileCtx& c, const uint8_t* w, const float* dm,
                            const float* /*unused*/, int64_t t0, float* y) {
  Q8TileOf<Q6_KRFormat, R, T>(c, w, dm, t0, y);
}

// Per row: the two f32 half-block scales of each block in order (4 per
// pair; zeros for a missing last block).
BATON_AVX512 void PrepQ6_KR(const uint8_t* w, int64_t row_bytes, int rows,
                            int64_t nb, float* dm, float* /*unused*/) {
  const int64_t npairs = (nb + 1) / 2;
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = w + r * row_bytes;
    float* dr = dm + r * npairs * 4;
    for (int64_t b = 0; b < nb; ++b) {
      std::memcpy(dr + 2 * b, row + b * kQ6_KRBlockBytes, 2 * sizeof(float));
    }
    if (nb & 1) dr[2 * nb] = dr[2 * nb + 1] = 0.0f;
  }
}

// Per row, per pair p: dm[2p..2p+1] = {d0, d1} (d1 = 0 if missing).
BATON_AVX512 void PrepQ8(const uint8_t* w, int64_t row_bytes, int rows,
                         int64_t nb, float* dm, float* /*unused*/) {
  const int64_t npairs = (nb + 1) / 2;
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = w + r * row_bytes;
    int64_t p = 0;
    for (; 2 * p + 8 <= nb; p += 4) {  // eight blocks at a time
      _mm256_storeu_ps(
          dm + r * npairs * 2 + 2 * p,
          BlockHalfs8<kQ8_0BlockBytes, 0>(row + 2 * p * kQ8_0BlockBytes));
    }
    for (; p < npairs; ++p) {
      uint16_t h0, h1 = 0;
      std::memcpy(&h0, row + 2 * p * kQ8_0BlockBytes, 2);
      if (2 * p + 1 < nb)
        std::memcpy(&h1, row + (2 * p + 1) * kQ8_0BlockBytes, 2);
      dm[r * npairs * 2 + 2 * p] = _cvtsh_ss(h0);
      dm[r * npairs * 2 + 2 * p + 1] = _cvtsh_ss(h1);
    }
  }
}

#endif  // BATON_KERNELS_CPU_MATMUL_AVX512_Q8_H_
