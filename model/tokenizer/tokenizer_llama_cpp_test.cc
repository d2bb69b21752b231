// Compares Baton's tokenizer on the default model with llama.cpp's ids,
// recorded in tests/data/tokenizer/smollm2_llama_cpp_golden.jsonl by
// scripts/reference/tokenizer_llama_golden.py.
#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gguf/gguf_file.h"
#include "model/tokenizer/byte_level.h"
#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/tokenizer_testing.h"
#include "model/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace baton {
namespace {

using tokenizer_testing::CorpusEntry;

class LlamaCppGoldenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = tokenizer_testing::RequireEnv("BATON_DEFAULT_MODEL");
    ASSERT_TRUE(model.ok()) << model.status();
    auto gguf = GgufFile::Open(*model);
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    const auto t0 = std::chrono::steady_clock::now();
    auto tok = Tokenizer::FromGguf(**gguf);
    load_ms_ = std::chrono::duration<double, std::milli>(
                   std::chrono::steady_clock::now() - t0)
                   .count();
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = std::move(*tok);
    auto corpus = tokenizer_testing::LoadCorpus();
    ASSERT_TRUE(corpus.ok()) << corpus.status();
    corpus_ = std::move(*corpus);
    auto path = tokenizer_testing::DataPath("smollm2_llama_cpp_golden.jsonl");
    ASSERT_TRUE(path.ok()) << path.status();
    auto text = tokenizer_testing::ReadFile(*path);
    ASSERT_TRUE(text.ok()) << text.status();
    std::istringstream lines(*text);
    std::string line;
    while (std::getline(lines, line)) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << line;
      golden_[j["name"].get<std::string>()] = {
          j["special"].get<std::vector<int32_t>>(),
          j["plain"].get<std::vector<int32_t>>()};
    }
  }

  double load_ms_ = 0;
  std::unique_ptr<Tokenizer> tok_;
  std::vector<CorpusEntry> corpus_;
  std::map<std::string, std::pair<std::vector<int32_t>, std::vector<int32_t>>>
      golden_;
};

TEST_F(LlamaCppGoldenTest, DefaultModelMetadata) {
  EXPECT_EQ(tok_->vocab_size(), 49152);
  EXPECT_EQ(tok_->bos_id(), std::optional<int32_t>(1));
  EXPECT_EQ(tok_->eos_id(), std::optional<int32_t>(2));
  EXPECT_FALSE(tok_->add_bos_default());
  EXPECT_TRUE(tok_->IsEndOfGeneration(2));  // <|im_end|>
  EXPECT_TRUE(tok_->IsEndOfGeneration(0));  // <|endoftext|>
  EXPECT_FALSE(tok_->IsEndOfGeneration(1));
  EXPECT_TRUE(tok_->IsSpecial(1));
  EXPECT_FALSE(tok_->IsSpecial(100));
  EXPECT_TRUE(tok_->notes().empty());
  EXPECT_THAT(tok_->chat_template_source(),
              ::testing::HasSubstr("<|im_start|>"));
  std::printf("vocab load: %.1f ms\n", load_ms_);  // measured, not asserted
}

TEST_F(LlamaCppGoldenTest, EveryCorpusStringMatches) {
  ASSERT_GE(corpus_.size(), 150u);
  int compared = 0;
  double encode_ms = 0;
  for (const CorpusEntry& e : corpus_) {
    auto it = golden_.find(e.name);
    ASSERT_NE(it, golden_.end())
        << "no golden entry for " << e.name << ": regenerate the golden file";
    for (bool special : {true, false}) {
      EncodeOptions opts;
      opts.parse_special = special;
      const auto t0 = std::chrono::steady_clock::now();
      const std::vector<int32_t> ids = tok_->Encode(e.bytes, opts);
      encode_ms += std::chrono::duration<double, std::milli>(
                       std::chrono::steady_clock::now() - t0)
                       .count();
      const std::vector<int32_t>& want =
          special ? it->second.first : it->second.second;
      EXPECT_EQ(ids, want) << e.name << " parse_special=" << special
                           << " text='" << absl::CHexEscape(e.bytes)
                           << "'\n got  " << absl::StrJoin(ids, ",")
                           << "\n want " << absl::StrJoin(want, ",");
      ++compared;
    }
  }
  std::printf(
      "compared %d encodings (%zu strings) with llama.cpp; encode %.2f ms\n",
      compared, corpus_.size(), encode_ms);
}

TEST_F(LlamaCppGoldenTest, DecodeRoundTrips) {
  // SmolLM2 has no token for some bytes (0x04, 0x1D, 0xFF, ...); BPE drops
  // them, as llama.cpp does.
  std::string untokenized;
  for (int b = 0; b < 256; ++b) {
    const std::string byte(1, static_cast<char>(b));
    if (!tok_->FindToken(byte_level::Encode(byte)).has_value())
      untokenized += byte;
  }
  EXPECT_EQ(untokenized.size(), 21u);
  int exact = 0;
  for (const CorpusEntry& e : corpus_) {
    // Invalid bytes come back as U+FFFD, lenient forms re-encoded.
    std::vector<uint32_t> cpts;
    utf8::DecodeLenient(e.bytes, &cpts);
    std::string want;
    for (uint32_t c : cpts) utf8::AppendEncoded(c, &want);
    const bool droppable = want.find_first_of(untokenized) != std::string::npos;
    std::string kept;
    for (char c : want) {
      if (untokenized.find(c) == std::string::npos) kept += c;
    }
    for (bool special : {true, false}) {
      EncodeOptions opts;
      opts.parse_special = special;
      const std::string decoded = tok_->Decode(tok_->Encode(e.bytes, opts));
      EXPECT_EQ(decoded, kept) << e.name;
      if (e.utf8 && !droppable) {
        EXPECT_EQ(decoded, e.bytes) << e.name;
        ++exact;
      }
    }
  }
  EXPECT_GT(exact, 300);
  std::printf("%d exact UTF-8 round trips\n", exact);
}

TEST_F(LlamaCppGoldenTest, SkipSpecialDropsControlTokens) {
  const std::vector<int32_t> ids =
      tok_->Encode("<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids.back(), 2);
  EXPECT_EQ(tok_->Decode(ids, /*skip_special=*/true), "user\nhi");
  EXPECT_EQ(tok_->Decode(ids), "<|im_start|>user\nhi<|im_end|>");
}

}  // namespace
}  // namespace baton
