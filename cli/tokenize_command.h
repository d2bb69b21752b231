// `baton tokenize`: text on stdin to token ids (or ids back to text).
#ifndef BATON_CLI_TOKENIZE_COMMAND_H_
#define BATON_CLI_TOKENIZE_COMMAND_H_

#include <istream>
#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace baton::cli {

struct TokenizeOptions {
  std::string model_path;
  bool decode = false;  // read space-separated ids, print text
  bool chat = false;    // wrap the text as a user message of the chat template
};

absl::Status RunTokenize(const TokenizeOptions& options, std::istream& in,
                         std::ostream& out);

}  // namespace baton::cli

#endif  // BATON_CLI_TOKENIZE_COMMAND_H_
