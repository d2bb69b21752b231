#include "cli/synth_command.h"

#include <cerrno>
#include <cstdio>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/synth/shapes.h"
#include "model/synth/synth_model.h"

namespace baton::cli {
namespace {

absl::StatusOr<DType> ParseType(absl::string_view type) {
  static const std::pair<const char*, DType> kTypes[] = {
      {"q4_1", DType::kQ4_1}, {"q4_0", DType::kQ4_0}, {"q8_0", DType::kQ8_0},
      {"f16", DType::kF16},   {"bf16", DType::kBF16},
  };
  std::string lower = absl::AsciiStrToLower(type);
  for (const auto& [name, dtype] : kTypes) {
    if (lower == name) return dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown --type '", type, "'; valid types: q4_1, q4_0, q8_0, f16, bf16"));
}

}  // namespace

absl::Status RunSynth(const SynthOptions& options, std::ostream& log) {
  BATON_ASSIGN_OR_RETURN(SynthShape shape, FindSynthShape(options.shape));
  BATON_ASSIGN_OR_RETURN(DType type, ParseType(options.type));
  if (options.out_path.empty()) {
    return absl::InvalidArgumentError(
        "--out must name the .gguf file to write");
  }
  if (options.threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads must be >= 0, got ", options.threads));
  }
  SynthModelOptions model_options;
  model_options.weight_type = type;
  model_options.seed = options.seed;
  model_options.threads = options.threads;
  const std::string partial = options.out_path + ".partial";
  absl::Status status = WriteSynthModel(shape, model_options, partial, &log);
  if (!status.ok()) {
    std::remove(partial.c_str());
    return status;
  }
  if (std::rename(partial.c_str(), options.out_path.c_str()) != 0) {
    int err = errno;
    std::remove(partial.c_str());
    return absl::ErrnoToStatus(
        err, absl::StrCat("cannot rename ", partial, " to ", options.out_path));
  }
  log << "synth: " << options.out_path << "\n";
  return absl::OkStatus();
}

}  // namespace baton::cli
