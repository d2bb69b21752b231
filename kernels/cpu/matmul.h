// y = x * W^T on the CPU for the weight types of GGUF models.
//
// Shapes: weight [rows, k] (TensorView shape {rows, k}), x [tokens, k]
// row-major f32, y [tokens, rows] row-major f32: y[t][r] = sum_i W[r][i]
// x[t][i].
//
// Quantized weights (Q4_0, Q4_1, Q8_0, and the layouts repack.h makes at
// load: Q4_K_R, Q5_K_R, Q6_K_R) multiply activations quantized to 8
// bits per block of 32 (see quantize_activations.h) with integer dot products
// and f32 accumulation across blocks; F32 and F16 weights multiply x directly.
//
// Batch invariance: every y[t][r] depends only on W's row r and x's row t,
// never on the number of tokens, the token's position, the thread count or
// the row partition, and every CpuIsa path computes it with the same fixed
// reduction order (matmul_kernels.h), so all paths agree bit-for-bit.
#ifndef BATON_KERNELS_CPU_MATMUL_H_
#define BATON_KERNELS_CPU_MATMUL_H_

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/quantize_activations.h"
#include "model/tensor.h"

namespace baton {

class ThreadPool;

struct MatMulOptions {
  // --- behaviour ---
  // Kernel path; FailedPrecondition if this CPU lacks it. All paths give
  // bit-identical results; only speed differs.
  CpuIsa isa = BestCpuIsa();
};

// The input of one or more MatMuls that share x (Q/K/V, gate/up): x is
// quantized at most once, by the first quantized weight that needs it.
// Reusable: Reset keeps the quantization buffers.
class MatMulInput {
 public:
  MatMulInput() = default;
  MatMulInput(const float* x, int64_t tokens, int64_t k) {
    Reset(x, tokens, k);
  }
  MatMulInput(const MatMulInput&) = delete;
  MatMulInput& operator=(const MatMulInput&) = delete;

  // x [tokens, k] is borrowed until the next Reset or destruction; it must
  // not change while this input is in use.
  void Reset(const float* x, int64_t tokens, int64_t k);

  const float* x() const { return x_; }
  int64_t tokens() const { return tokens_; }
  int64_t k() const { return k_; }

  // x quantized (computed on the first call). Errors as QuantizeActivations.
  absl::StatusOr<const Q8Activations*> Quantized(ThreadPool* pool, CpuIsa isa);

 private:
  const float* x_ = nullptr;
  int64_t tokens_ = 0;
  int64_t k_ = 0;
  bool quantized_ = false;
  Q8Activations q8_;
};

// y [input.tokens(), rows] = input.x() * weight^T, rows split across pool's
// threads (pool may be null: single-threaded).
// Errors: Unimplemented for a weight dtype other than F32, F16, Q4_0, Q4_1,
// Q8_0, Q4_K_R, Q5_K_R, Q6_K_R (naming it); InvalidArgument if the weight is
// not 2-D, its data is null or shorter than its shape needs, k is not a
// positive multiple of 32, the input's k differs from the weight's, tokens < 0,
// or x / y is null while tokens > 0; FailedPrecondition if options.isa is not
// supported here.
absl::Status MatMul(const TensorView& weight, MatMulInput& input, float* y,
                    ThreadPool* pool, const MatMulOptions& options = {});

// One output of MatMulGroup: y [tokens, weight rows].
struct MatMulTarget {
  const TensorView* weight;
  float* y;
};

// Several weights sharing one input (Q/K/V, gate/up) in a single parallel
// region: each y = input.x() * weight^T exactly as MatMul computes it (the
// same bits), with one thread-pool synchronisation instead of one per
// weight. Errors as MatMul, for the first weight that has one.
absl::Status MatMulGroup(std::span<const MatMulTarget> targets,
                         MatMulInput& input, ThreadPool* pool,
                         const MatMulOptions& options = {});

// Convenience for a single weight: x [tokens, k].
absl::Status MatMul(const TensorView& weight, const float* x, int64_t tokens,
                    float* y, ThreadPool* pool,
                    const MatMulOptions& options = {});

}  // namespace baton

#endif  // BATON_KERNELS_CPU_MATMUL_H_
