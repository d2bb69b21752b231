// Activations quantized to 8 bits per block of 32, the input format of the
// integer dot products in the quantized MatMul kernels.
//
// Block b of token t holds x[t][32b .. 32b+31] as
//   d' = max|x| / 127 (f32),  q[i] = round_half_even(x[i] * (1/d')),
//   scale d = half(d'),  sum s = half(d' * (q[0] + ... + q[31]))
// where half() rounds to the nearest IEEE half (as GGUF's Q8_0/Q8_1 store
// them; Q4_0/Q4_1 weights need s), so x[i] ~= d * q[i] with
// |x[i] - d * q[i]| <= d' / 2 + 127 * |d - d'| and |q[i]| <= 127.
// d = 0 (and q = 0) for an all-zero block. Inputs must be finite.
// Every ISA path produces bit-identical blocks.
#ifndef BATON_KERNELS_CPU_QUANTIZE_ACTIVATIONS_H_
#define BATON_KERNELS_CPU_QUANTIZE_ACTIVATIONS_H_

#include <cstdint>
#include <cstdlib>
#include <memory>

#include "absl/status/status.h"
#include "kernels/cpu/cpu_features.h"

namespace baton {

class ThreadPool;

inline constexpr int64_t kQ8BlockSize = 32;

// [tokens, k] quantized activations; storage is reused across Resize calls.
class Q8Activations {
 public:
  Q8Activations() = default;
  Q8Activations(const Q8Activations&) = delete;
  Q8Activations& operator=(const Q8Activations&) = delete;
  Q8Activations(Q8Activations&&) = default;
  Q8Activations& operator=(Q8Activations&&) = default;

  // REQUIRES: tokens >= 0, k >= 0 and k % 32 == 0.
  void Resize(int64_t tokens, int64_t k);

  int64_t tokens() const { return tokens_; }
  int64_t k() const { return k_; }
  int64_t blocks_per_token() const { return k_ / kQ8BlockSize; }

  // quants(t): k int8 values (64-byte aligned); scales(t), sums(t):
  // blocks_per_token() floats each.
  int8_t* quants(int64_t t) { return quants_.get() + t * k_; }
  const int8_t* quants(int64_t t) const { return quants_.get() + t * k_; }
  float* scales(int64_t t) { return scales_.get() + t * blocks_per_token(); }
  const float* scales(int64_t t) const {
    return scales_.get() + t * blocks_per_token();
  }
  float* sums(int64_t t) { return sums_.get() + t * blocks_per_token(); }
  const float* sums(int64_t t) const {
    return sums_.get() + t * blocks_per_token();
  }

 private:
  struct FreeDeleter {
    void operator()(void* p) const { std::free(p); }
  };
  template <typename T>
  using Buffer = std::unique_ptr<T[], FreeDeleter>;

  int64_t tokens_ = 0;
  int64_t k_ = 0;
  int64_t quant_capacity_ = 0;
  int64_t block_capacity_ = 0;
  Buffer<int8_t> quants_;
  Buffer<float> scales_;
  Buffer<float> sums_;
};

// Quantizes one row of k values (k % 32 == 0) into q[k], d[k/32], s[k/32].
// REQUIRES: IsCpuIsaSupported(isa).
void QuantizeRowQ8(const float* x, int64_t k, int8_t* q, float* d, float* s,
                   CpuIsa isa);

// Quantizes x [tokens, k] (row-major) into *out, splitting tokens across
// pool (may be null). InvalidArgument if k is not a positive multiple of 32
// or tokens < 0; FailedPrecondition if isa is not supported by this CPU.
absl::Status QuantizeActivations(const float* x, int64_t tokens, int64_t k,
                                 Q8Activations* out, ThreadPool* pool,
                                 CpuIsa isa = BestCpuIsa());

}  // namespace baton

#endif  // BATON_KERNELS_CPU_QUANTIZE_ACTIVATIONS_H_
