// `baton inspect`: prints a model file's architecture, config, tokenizer
// summary and tensor table.
#ifndef BATON_CLI_INSPECT_COMMAND_H_
#define BATON_CLI_INSPECT_COMMAND_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace baton::cli {

struct InspectOptions {
  std::string model_path;  // a .gguf file, or an HF folder / .safetensors file
  bool show_metadata = false;  // also print every GGUF metadata key
};

absl::Status RunInspect(const InspectOptions& options, std::ostream& out);

}  // namespace baton::cli

#endif  // BATON_CLI_INSPECT_COMMAND_H_
