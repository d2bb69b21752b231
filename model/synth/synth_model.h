// Writes a synthetic Llama-architecture GGUF model: a named shape's tensors
// and metadata, exactly as llama.cpp's "llama" architecture expects them,
// with seeded random weights and a self-contained tokenizer vocabulary.
#ifndef BATON_MODEL_SYNTH_SYNTH_MODEL_H_
#define BATON_MODEL_SYNTH_SYNTH_MODEL_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/gguf/gguf_writer.h"
#include "model/synth/shapes.h"
#include "model/tensor.h"

namespace baton {

// What a tensor holds.
enum class SynthFill {
  kRandom,     // uniform weights of SynthModelOptions::weight_std
  kOnes,       // RMS norm weights
  kRopeFreqs,  // SynthRopeFreqFactors(shape)
};

struct SynthTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  // outermost first
  SynthFill fill;
};

struct SynthModelOptions {
  // --- behaviour ---
  // Type of the attention and feed-forward matrices: Q4_0, Q4_1, Q8_0, F16,
  // BF16 or F32. token_embd (and output.weight when untied) is Q8_0 for the
  // 4-bit types, as in the default model, else the same type; norms and
  // rope_freqs are F32.
  DType weight_type = DType::kQ4_1;
  // Same seed, shape and type: byte-identical file. A tensor's float values
  // depend only on the seed and its name (not on weight_type).
  uint64_t seed = 0;
  // Standard deviation of the uniform random weights.
  float weight_std = 0.02f;

  // --- performance ---
  // Generating and quantizing threads; 0 = all cores.
  int threads = 0;
  // Elements generated per step (bounds memory: ~6 bytes per element).
  int64_t chunk_elements = int64_t{1} << 24;
};

// The tensors, in file order. InvalidArgument for a weight_type the
// quantizer does not write or a shape whose rows are not whole blocks.
absl::StatusOr<std::vector<SynthTensor>> PlanSynthTensors(
    const SynthShape& shape, DType weight_type);

// Adds general.*, llama.* and tokenizer.* metadata for `shape`.
absl::Status AddSynthMetadata(const SynthShape& shape, DType weight_type,
                              GgufWriter& writer);

// Writes the whole model to `path` (which it creates or truncates),
// streaming one chunk at a time. Progress lines go to `log` if not null.
// ResourceExhausted, before writing tensor data, if the file system has
// less free space than the file needs.
absl::Status WriteSynthModel(const SynthShape& shape,
                             const SynthModelOptions& options,
                             const std::string& path, std::ostream* log);

// GGUF general.file_type (llama_ftype) of a file whose matrices are `type`.
absl::StatusOr<uint32_t> SynthFileType(DType weight_type);

}  // namespace baton

#endif  // BATON_MODEL_SYNTH_SYNTH_MODEL_H_
