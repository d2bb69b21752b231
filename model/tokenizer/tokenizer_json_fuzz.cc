// libFuzzer target: arbitrary bytes as a HF tokenizer.json (and, after the
// first NUL byte, a tokenizer_config.json). Loading either succeeds or
// returns a status naming the problem (never an exception, crash or
// sanitizer report); a tokenizer that loads encodes and decodes a fixed text
// with every id in range, and the chat template it names is recognised or
// refused with a status.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/check.h"
#include "model/tokenizer/chat_template.h"
#include "model/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const absl::string_view json = input.substr(0, nul);
  const absl::string_view config = nul == absl::string_view::npos
                                       ? absl::string_view()
                                       : input.substr(nul + 1);
  auto tok = baton::Tokenizer::FromHfJsonText(json, config);
  if (!tok.ok()) {
    BATON_CHECK(!tok.status().message().empty())
        << "an error without a message";
    return 0;
  }
  for (bool special : {true, false}) {
    baton::EncodeOptions options;
    options.parse_special = special;
    const std::vector<int32_t> ids = (*tok)->Encode(
        "Hello, world! 12345 h\xc3\xa9llo <|im_end|>\n", options);
    for (int32_t id : ids) BATON_CHECK((*tok)->IsValidId(id)) << id;
    (void)(*tok)->Decode(ids);
  }
  baton::ChatTemplateOptions template_options;
  template_options.allow_chatml_fallback = true;
  auto chat = baton::ChatTemplate::ForTokenizer(**tok, template_options);
  BATON_CHECK(chat.ok()) << "the ChatML fallback refused: " << chat.status();
  return 0;
}
