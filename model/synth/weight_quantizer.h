// float32 weights -> GGUF block types, bit-exact with the gguf Python
// package's gguf.quants.quantize (same float32 operations in the same order,
// each product rounded on its own).
#ifndef BATON_MODEL_SYNTH_WEIGHT_QUANTIZER_H_
#define BATON_MODEL_SYNTH_WEIGHT_QUANTIZER_H_

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "model/tensor.h"

namespace baton {

// True for the types QuantizeWeights() writes: F32, F16, BF16, Q4_0, Q4_1,
// Q8_0.
bool CanQuantizeWeights(DType dtype);

// Quantizes `src` (any number of whole rows, laid out contiguously) into
// `dst`. Blocks never straddle rows because a row is a whole number of
// blocks, so the row size does not matter here.
// REQUIRES (else InvalidArgument): CanQuantizeWeights(dtype),
// src.size() a multiple of the block size, dst.size() == the bytes of
// src.size() elements. Values should be finite: the result for NaN or
// infinity is defined (no crash) but not promised to match numpy.
absl::Status QuantizeWeights(DType dtype, std::span<const float> src,
                             std::span<uint8_t> dst);

}  // namespace baton

#endif  // BATON_MODEL_SYNTH_WEIGHT_QUANTIZER_H_
