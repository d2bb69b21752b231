#include "model/tokenizer/incremental_decoder.h"

#include <random>
#include <string>
#include <vector>

#include "common/check.h"
#include "gtest/gtest.h"
#include "model/gguf/gguf_file.h"
#include "model/tokenizer/byte_level.h"
#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/tokenizer_testing.h"
#include "model/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace baton {
namespace {

// The 256 byte tokens and no merges, so every multi-byte character is split
// across tokens; plus one special token <s> = 256.
std::unique_ptr<Tokenizer> ByteTokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) {
    vocab[byte_level::Encode(std::string(1, static_cast<char>(b)))] = b;
  }
  nlohmann::json j = {
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", nlohmann::json::array()}}},
      {"added_tokens", {{{"id", 256}, {"content", "<s>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
      {"decoder", {{"type", "ByteLevel"}}}};
  auto tok = Tokenizer::FromHfJsonText(j.dump(), "");
  BATON_CHECK_OK(tok.status());
  return std::move(*tok);
}

std::string Stream(const Tokenizer& tok, const std::vector<int32_t>& ids,
                   std::vector<std::string>* pushes = nullptr) {
  IncrementalDecoder dec(tok);
  std::string out;
  for (int32_t id : ids) {
    std::string piece = dec.Push(id);
    EXPECT_TRUE(utf8::IsValid(piece)) << "piece is not valid UTF-8";
    if (pushes != nullptr) pushes->push_back(piece);
    out += piece;
  }
  const std::string tail = dec.Finish();
  EXPECT_TRUE(utf8::IsValid(tail));
  return out + tail;
}

TEST(IncrementalDecoderTest, HoldsBackSplitCharacters) {
  auto tok = ByteTokenizer();
  const std::string text = "a€😀";  // 1 + 3 + 4 bytes
  const std::vector<int32_t> ids = tok->Encode(text);
  ASSERT_EQ(ids.size(), 8u);
  std::vector<std::string> pushes;
  EXPECT_EQ(Stream(*tok, ids, &pushes), text);
  EXPECT_EQ(pushes,
            (std::vector<std::string>{"a", "", "", "€", "", "", "", "😀"}));
}

TEST(IncrementalDecoderTest, InvalidBytesBecomeReplacementCharacters) {
  auto tok = ByteTokenizer();
  IncrementalDecoder dec(*tok);
  EXPECT_EQ(dec.Push(0xE2), "");
  EXPECT_EQ(dec.pending_bytes(), 1u);
  // 'x' cannot continue E2: the held byte becomes U+FFFD, then 'x'.
  EXPECT_EQ(dec.Push('x'), "\xEF\xBF\xBDx");
  EXPECT_EQ(dec.Push(0xFF), "\xEF\xBF\xBD");
  EXPECT_EQ(dec.Push(0xF0), "");
  EXPECT_EQ(dec.Push(0x9F), "");
  // A truncated tail is one U+FFFD (maximal subpart).
  EXPECT_EQ(dec.Finish(), "\xEF\xBF\xBD");
  EXPECT_EQ(dec.pending_bytes(), 0u);
  EXPECT_EQ(dec.Push('y'), "y");
}

TEST(IncrementalDecoderTest, SkipSpecial) {
  auto tok = ByteTokenizer();
  IncrementalDecoder keep(*tok);
  EXPECT_EQ(keep.Push(256), "<s>");
  IncrementalDecoder skip(*tok, /*skip_special=*/true);
  EXPECT_EQ(skip.Push(256), "");
}

TEST(IncrementalDecoderTest, SeededRandomTextMatchesDecode) {
  auto tok = ByteTokenizer();
  std::mt19937 rng(1234);
  const std::vector<uint32_t> alphabet = {'a',     ' ',    0xE9, 0x20AC,
                                          0x1F600, 0x4E16, '\n'};
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    const int n = rng() % 20;
    for (int i = 0; i < n; ++i) {
      utf8::AppendEncoded(alphabet[rng() % alphabet.size()], &text);
    }
    const std::vector<int32_t> ids = tok->Encode(text);
    EXPECT_EQ(Stream(*tok, ids), tok->Decode(ids));
    EXPECT_EQ(Stream(*tok, ids), text);
  }
}

// On the default model: every corpus string that is valid UTF-8 streams back
// exactly, including emoji whose bytes span several tokens.
TEST(IncrementalDecoderTest, DefaultModelCorpus) {
  auto model = tokenizer_testing::RequireEnv("BATON_DEFAULT_MODEL");
  ASSERT_TRUE(model.ok()) << model.status();
  auto gguf = GgufFile::Open(*model);
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto tok = Tokenizer::FromGguf(**gguf);
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto corpus = tokenizer_testing::LoadCorpus();
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  int split_chars = 0;
  for (const auto& e : *corpus) {
    const std::vector<int32_t> ids = (*tok)->Encode(e.bytes);
    const std::string decoded = (*tok)->Decode(ids);
    std::vector<std::string> pushes;
    const std::string streamed = Stream(**tok, ids, &pushes);
    std::string want;
    utf8::AppendSanitized(decoded, false, &want);
    EXPECT_EQ(streamed, want) << e.name;
    if (e.utf8 && utf8::IsValid(decoded)) {
      EXPECT_EQ(streamed, decoded) << e.name;
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      if (pushes[i].empty() && !(*tok)->TokenToBytes(ids[i]).empty())
        ++split_chars;
    }
  }
  // The corpus has emoji and CJK characters that SmolLM2 splits across tokens.
  EXPECT_GT(split_chars, 10);
}

}  // namespace
}  // namespace baton
