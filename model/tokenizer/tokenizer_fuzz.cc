// libFuzzer target: encodes arbitrary bytes with the default model's
// tokenizer ($BATON_DEFAULT_MODEL) and checks that ids are in range, that
// decoding gives back the input (invalid bytes as U+FFFD, lenient forms
// re-encoded, bytes the vocabulary has no token for dropped), and that
// streaming detokenization equals the sanitized Decode.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/check.h"
#include "model/gguf/gguf_file.h"
#include "model/tokenizer/byte_level.h"
#include "model/tokenizer/incremental_decoder.h"
#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/utf8.h"

namespace {

struct State {
  std::unique_ptr<baton::GgufFile> gguf;
  std::unique_ptr<baton::Tokenizer> tok;
  std::string untokenized;  // bytes without a single-byte token
};

State* Init() {
  auto* s = new State();
  const char* path = std::getenv("BATON_DEFAULT_MODEL");
  if (path == nullptr || *path == '\0') {
    std::fprintf(stderr,
                 "tokenizer_fuzz: set BATON_DEFAULT_MODEL to the GGUF path\n");
    std::abort();
  }
  auto gguf = baton::GgufFile::Open(path);
  BATON_CHECK_OK(gguf.status());
  s->gguf = std::move(*gguf);
  auto tok = baton::Tokenizer::FromGguf(*s->gguf);
  BATON_CHECK_OK(tok.status());
  s->tok = std::move(*tok);
  for (int b = 0; b < 256; ++b) {
    const std::string byte(1, static_cast<char>(b));
    if (!s->tok->FindToken(baton::byte_level::Encode(byte)).has_value()) {
      s->untokenized += byte;
    }
  }
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static State* state = Init();
  const baton::Tokenizer& tok = *state->tok;
  const std::string input(reinterpret_cast<const char*>(data), size);

  std::vector<uint32_t> cpts;
  baton::utf8::DecodeLenient(input, &cpts);
  std::string want;
  for (uint32_t c : cpts) {
    std::string enc;
    baton::utf8::AppendEncoded(c, &enc);
    for (char ch : enc) {
      if (state->untokenized.find(ch) == std::string::npos) want += ch;
    }
  }
  for (bool special : {true, false}) {
    baton::EncodeOptions options;
    options.parse_special = special;
    const std::vector<int32_t> ids = tok.Encode(input, options);
    for (int32_t id : ids) BATON_CHECK(tok.IsValidId(id)) << id;
    const std::string decoded = tok.Decode(ids);
    BATON_CHECK(decoded == want) << "round trip differs, special=" << special;
    if (baton::utf8::IsValid(input) &&
        input.find_first_of(state->untokenized) == std::string::npos) {
      BATON_CHECK(decoded == input);
    }
    baton::IncrementalDecoder stream(tok);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = stream.Push(id);
      BATON_CHECK(baton::utf8::IsValid(piece));
      streamed += piece;
    }
    streamed += stream.Finish();
    std::string sanitized;
    baton::utf8::AppendSanitized(decoded, false, &sanitized);
    BATON_CHECK(streamed == sanitized);
  }
  return 0;
}
