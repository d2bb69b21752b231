// `baton synth`: writes a synthetic model at a real model's shape (seeded
// random weights, self-contained tokenizer) as a GGUF file llama.cpp and
// Baton load like the real one.
#ifndef BATON_CLI_SYNTH_COMMAND_H_
#define BATON_CLI_SYNTH_COMMAND_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace baton::cli {

struct SynthOptions {
  // A shape name: tiny, smollm2-135m, llama-3.2-1b or llama-3-8b.
  std::string shape = "smollm2-135m";
  // The .gguf file to write; written as `out_path`.partial, then renamed.
  std::string out_path;
  // Matrix type: q4_1 (token_embd/output Q8_0), q4_0, q8_0, f16 or bf16.
  std::string type = "q4_1";
  // Same seed, shape and type: byte-identical file.
  uint64_t seed = 0;
  // Generating threads; 0 = all cores.
  int threads = 0;
};

// InvalidArgument naming the valid values for an unknown shape or type or an
// empty out_path; I/O errors from writing. Progress lines go to `log`. On
// failure the partial file is removed and `out_path` is untouched.
absl::Status RunSynth(const SynthOptions& options, std::ostream& log);

}  // namespace baton::cli

#endif  // BATON_CLI_SYNTH_COMMAND_H_
