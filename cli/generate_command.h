// `baton generate`: runs the engine in-process on one prompt (streaming text)
// or a file of prompts (batched together, one JSON line each).
#ifndef BATON_CLI_GENERATE_COMMAND_H_
#define BATON_CLI_GENERATE_COMMAND_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "worker/engine/engine.h"
#include "worker/sampler/sampling_params.h"

namespace baton::cli {

struct GenerateOptions {
  std::string model_path;
  std::string prompt;        // one prompt, or
  std::string prompts_file;  // one prompt per line, all submitted at once
  bool raw = false;          // skip the chat template
  bool json = false;         // JSON per request instead of streamed text
  bool show_probs = false;   // per token, the top candidates and probabilities
  SamplingParams sampling;
  EngineOptions engine;
};

// Text (or JSON lines) go to `out`; timings and diagnostics to `err`.
absl::Status RunGenerate(const GenerateOptions& options, std::ostream& out,
                         std::ostream& err);

}  // namespace baton::cli

#endif  // BATON_CLI_GENERATE_COMMAND_H_
