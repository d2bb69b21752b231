// Per-row token choice on the GPU over logits [batch][vocab] float32:
// argmax and the sampler's temperature / top-k / top-p / min-p draw, with the
// semantics of RequestSampler (worker/sampler/sampler.h) exactly:
//   temperature == 0: argmax, ties to the lowest id;
//   otherwise weights w = exp(-(z_max - z) / temperature) (the softmax up to
//   its normalization) over the finite logits, in the order "logit
//   descending, ties by id ascending"; top-k keeps the first k; top-p keeps a
//   candidate iff the mass before it is < top_p * (kept mass); min-p keeps
//   w >= min_p (w of the best is 1); then the first candidate whose
//   cumulative mass exceeds uniform * (kept mass) is drawn.
// Penalties (repetition/frequency/presence) are not applied here: the caller
// applies them to the logits first (RequestSampler::ApplyPenalties on the
// host, or a later device kernel).
//
// Design (one thread block per row, no sort of the vocabulary, no bound on
// k or on the number of candidates top-p keeps): a token's position in the
// order is located by descending over its 32-bit order-preserving logit key
// with 2048-bin histograms of (count, mass) over shrinking key ranges (at
// most 3 levels), then resolving ties, which all share one weight,
// arithmetically. Masses are 64-bit fixed point (weight * 2^40, rounded),
// so every sum is exact and independent of thread order: a row's token is a
// deterministic function of its logits and parameters, whatever the batch.
// Differences from the CPU sampler, all at the level of float rounding:
// weights use CUDA expf (<= 2 ulp) instead of glibc expf, masses are rounded
// to 2^-40 (a weight below 2^-41 counts as 0 and is never drawn), and sums
// are exact instead of double. A draw can therefore differ from the CPU's
// only when uniform * mass lies within ~1e-6 relative of a candidate
// boundary.
//
// Cost per row: 1 pass over the logits for greedy rows, at most 14 for
// sampled rows (best 1, top-k 3, kept mass 1, top-p 3, min-p 2, draw 3, tie
// resolution 1), each reading the row once; a pass computes expf only for
// tokens inside the key range still in question.
#ifndef BATON_KERNELS_CUDA_SAMPLING_H_
#define BATON_KERNELS_CUDA_SAMPLING_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace baton::cuda {

// One row's parameters as the device reads them (SamplingParams' meanings).
// REQUIRES (as ValidateSamplingFields checks on the host): temperature
// finite and >= 0, top_k >= 0, top_p in (0, 1], min_p in [0, 1], uniform in
// [0, 1). Out-of-range values do not cause undefined behaviour: temperature
// not > 0 means greedy, top_k <= 0 or >= the number of finite logits turns
// top-k off, top_p not < 1 turns top-p off (top_p <= 0 keeps one
// candidate), min_p not > 0 turns min-p off, uniform is clamped to [0, 1).
struct SampleRowParams {
  double temperature = 1.0;
  double top_p = 1.0;
  double min_p = 0.0;
  // The draw's uniform: SamplerUniform(seed, num_generated) reproduces the
  // CPU sampler's.
  double uniform = 0.0;
  int32_t top_k = 0;
  int32_t reserved = 0;
};
static_assert(sizeof(SampleRowParams) == 40, "device layout");

// The uniform in [0, 1) that RequestSampler with `seed` uses for draw `n`
// (n = tokens accepted so far): output n of SplitMix64(seed), top 53 bits.
double SamplerUniform(uint64_t seed, uint64_t n);

// tokens[b] = the id of the largest logits[b][v] (ties: lowest id); NaN
// entries are ignored, -inf and +inf take part; -1 for a row of NaN only.
// logits: device [batch][vocab] float32; tokens: device [batch] int32.
// cudaErrorInvalidValue without launching if batch < 0, vocab < 1 with
// batch > 0, or a pointer is null with batch > 0. No synchronization.
cudaError_t ArgmaxRows(const float* logits, int32_t* tokens, int32_t batch,
                       int32_t vocab, cudaStream_t stream);

// tokens[b] = the token the CPU sampler would draw for logits[b] and
// params[b] (see the top of this file). Candidates are the finite logits;
// a row without one gets -1 (the CPU sampler rejects it as input).
// REQUIRES: no NaN or +inf logits (the CPU sampler rejects them; here they
// are ignored). logits: device [batch][vocab] float32; params: device
// [batch]; tokens: device [batch] int32. cudaErrorInvalidValue without
// launching if batch < 0, vocab < 1 with batch > 0, or a pointer is null
// with batch > 0. No synchronization.
cudaError_t SampleRows(const float* logits, const SampleRowParams* params,
                       int32_t* tokens, int32_t batch, int32_t vocab,
                       cudaStream_t stream);

}  // namespace baton::cuda

#endif  // BATON_KERNELS_CUDA_SAMPLING_H_
