#include "bench/common/memory_bandwidth.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>

#include "kernels/cpu/cpu_features.h"

namespace baton::bench {
namespace {

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

__attribute__((target("avx512f"))) double ReadAvx512(const float* p,
                                                     int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < n; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
  }
  float out[16];
  _mm512_storeu_ps(out,
                   _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  double sum = 0;
  for (float v : out) sum += v;
  return sum;
}

__attribute__((target("avx2"))) double ReadAvx2(const float* p, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  float out[8];
  _mm256_storeu_ps(out,
                   _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

// GB/s of a vectorised read of a 1 GiB buffer split across the pool.
}  // namespace

double ReadBandwidthGBs(ThreadPool* pool, int reps) {
  const int64_t n = int64_t{1} << 28;  // floats
  float* buf = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
  for (int64_t i = 0; i < n; ++i) buf[i] = 1.0f;
  const bool avx512 = GetCpuFeatures().avx512f;
  volatile double sink = 0;
  const double s = BestSeconds(reps, [&] {
    pool->ParallelFor(pool->num_threads(), [&](int64_t b, int64_t e) {
      for (int64_t part = b; part < e; ++part) {
        const int64_t len = n / pool->num_threads();
        const float* p = buf + part * len;
        sink = sink + (avx512 ? ReadAvx512(p, len) : ReadAvx2(p, len));
      }
    });
  });
  std::free(buf);
  return n * sizeof(float) / s / 1e9;
}

double BestSeconds(int reps, const std::function<void()>& f) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const double t0 = Now();
    f();
    best = std::min(best, Now() - t0);
  }
  return best;
}

}  // namespace baton::bench
