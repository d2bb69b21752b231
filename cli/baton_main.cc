// `baton`: the command-line tool. Subcommands:
//   baton inspect  --model=PATH                 model summary and tensor table
//   baton tokenize --model=PATH [--decode] [--chat]   stdin -> ids (or back)
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "cli/inspect_command.h"

ABSL_FLAG(std::string, model, "",
          "Model: a .gguf file (or, for inspect, an HF folder or .safetensors)");
ABSL_FLAG(bool, metadata, false, "inspect: also print every metadata key");

namespace {

constexpr char kUsage[] =
    "baton SUBCOMMAND [--flags]\n"
    "  inspect  --model=PATH [--metadata]   model config, tokenizer, tensors\n";

int Fail(const absl::Status& status) {
  std::cerr << "baton: " << status << "\n";
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::cerr << kUsage;
    return 2;
  }
  std::string command = args[1];
  if (command == "inspect") {
    baton::cli::InspectOptions options;
    options.model_path = absl::GetFlag(FLAGS_model);
    options.show_metadata = absl::GetFlag(FLAGS_metadata);
    absl::Status status = baton::cli::RunInspect(options, std::cout);
    return status.ok() ? 0 : Fail(status);
  }
  std::cerr << "baton: unknown subcommand '" << command << "'\n" << kUsage;
  return 2;
}
