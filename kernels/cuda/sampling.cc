#include "kernels/cuda/sampling.h"

namespace baton::cuda {

// Must stay identical to RequestSampler's stream (worker/sampler/sampler.cc);
// sampling_test checks it against the CPU sampler.
double SamplerUniform(uint64_t seed, uint64_t n) {
  uint64_t x = seed + (n + 1) * 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return static_cast<double>(x >> 11) * 0x1.0p-53;
}

}  // namespace baton::cuda
