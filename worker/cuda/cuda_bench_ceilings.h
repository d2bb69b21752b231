// The two hardware ceilings cuda_forward_bench compares the forward pass
// with, measured on the current device in the same run.
#ifndef BATON_WORKER_CUDA_CUDA_BENCH_CEILINGS_H_
#define BATON_WORKER_CUDA_CUDA_BENCH_CEILINGS_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace baton {

// HBM bandwidth in GB/s (1e9 bytes), counting bytes read plus bytes written,
// of a device-to-device cudaMemcpyAsync of `bytes`: the best of `repeats`
// copies timed with cudaEvents after one warm-up copy.
absl::StatusOr<double> MeasureHbmBandwidth(uint64_t bytes, int repeats);

// Dense bf16 GEMM rate in TFLOP/s (2 * m * n * k per product, bf16 inputs,
// fp32 output and accumulation, through CudaGemm) on seeded random inputs:
// the best of `repeats` products timed with cudaEvents after one warm-up.
absl::StatusOr<double> MeasureBf16GemmTflops(int64_t m, int64_t n, int64_t k,
                                             int repeats);

}  // namespace baton

#endif  // BATON_WORKER_CUDA_CUDA_BENCH_CEILINGS_H_
