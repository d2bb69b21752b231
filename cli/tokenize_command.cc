#include "cli/tokenize_command.h"

#include <iterator>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "model/gguf/gguf_file.h"
#include "model/tokenizer/chat_template.h"
#include "model/tokenizer/tokenizer.h"

namespace baton::cli {

absl::Status RunTokenize(const TokenizeOptions& options, std::istream& in,
                         std::ostream& out) {
  if (options.model_path.empty())
    return absl::InvalidArgumentError("--model is required");
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<GgufFile> gguf;
  if (options.model_path.size() > 5 &&
      options.model_path.substr(options.model_path.size() - 5) == ".gguf") {
    BATON_ASSIGN_OR_RETURN(gguf, GgufFile::Open(options.model_path));
    BATON_ASSIGN_OR_RETURN(tokenizer, Tokenizer::FromGguf(*gguf));
  } else {
    std::string path = options.model_path;
    if (path.find("tokenizer.json") == std::string::npos)
      path += "/tokenizer.json";
    BATON_ASSIGN_OR_RETURN(tokenizer, Tokenizer::FromHfJson(path));
  }
  std::string input(std::istreambuf_iterator<char>(in), {});
  if (options.decode) {
    std::vector<int32_t> ids;
    for (absl::string_view word :
         absl::StrSplit(input, absl::ByAnyChar(" \t\r\n"), absl::SkipEmpty())) {
      int32_t id;
      if (!absl::SimpleAtoi(word, &id) || !tokenizer->IsValidId(id)) {
        return absl::InvalidArgumentError(
            absl::StrCat("'", word, "' is not a token id in [0, ",
                         tokenizer->vocab_size(), ")"));
      }
      ids.push_back(id);
    }
    out << tokenizer->Decode(ids);
    return absl::OkStatus();
  }
  std::vector<int32_t> ids;
  if (options.chat) {
    BATON_ASSIGN_OR_RETURN(ChatTemplate chat,
                           ChatTemplate::ForTokenizer(*tokenizer));
    std::vector<ChatMessage> messages = {{"user", input}};
    EncodeOptions encode;
    if (chat.renders_bos()) encode.add_bos = false;
    ids = tokenizer->Encode(
        chat.Apply(messages, /*add_generation_prompt=*/true), encode);
  } else {
    ids = tokenizer->Encode(input);
  }
  out << absl::StrJoin(ids, " ") << "\n";
  return absl::OkStatus();
}

}  // namespace baton::cli
