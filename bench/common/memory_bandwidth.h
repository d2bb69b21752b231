// The machine's DRAM read bandwidth, measured with a vectorised read loop
// (AVX-512 or AVX2 loads; a scalar float reduction understates it ~2x).
#ifndef BATON_BENCH_COMMON_MEMORY_BANDWIDTH_H_
#define BATON_BENCH_COMMON_MEMORY_BANDWIDTH_H_

#include <functional>

#include "kernels/cpu/thread_pool.h"

namespace baton::bench {

// Wall seconds of the fastest of `reps` calls of f.
double BestSeconds(int reps, const std::function<void()>& f);

// GB/s (1e9 bytes) of the best of `reps` passes reading a 1 GiB buffer, split
// evenly across the pool's threads.
double ReadBandwidthGBs(ThreadPool* pool, int reps);

}  // namespace baton::bench

#endif  // BATON_BENCH_COMMON_MEMORY_BANDWIDTH_H_
