#include "model/tokenizer/tokenizer.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gguf/gguf_file.h"
#include "model/tokenizer/byte_level.h"
#include "model/tokenizer/pre_tokenizer.h"
#include "model/tokenizer/tokenizer_testing.h"
#include "nlohmann/json.hpp"

namespace baton {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;
using tokenizer_testing::GgufBuilder;

// Ids 0..255 are the byte tokens; then the merged tokens below.
Json SmallVocab() {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) {
    vocab[byte_level::Encode(std::string(1, static_cast<char>(b)))] = b;
  }
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  vocab["hello"] = 259;
  vocab["aa"] = 260;
  vocab["Ġw"] = 261;
  return vocab;
}

Json SmallTokenizerJson() {
  return {
      {"model",
       {{"type", "BPE"},
        {"vocab", SmallVocab()},
        {"merges", {"h e", "l l", "he ll", "hell o", "a a", "Ġ w"}}}},
      {"added_tokens",
       {{{"id", 262}, {"content", "<|im_start|>"}, {"special", true}},
        {{"id", 263}, {"content", "<tool>"}, {"special", false}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
      {"decoder", {{"type", "ByteLevel"}}}};
}

std::unique_ptr<Tokenizer> Load(const Json& j, absl::string_view config = "") {
  auto tok = Tokenizer::FromHfJsonText(j.dump(), config);
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

absl::Status LoadStatus(const Json& j) {
  return Tokenizer::FromHfJsonText(j.dump(), "").status();
}

TEST(TokenizerTest, BpeMergesByRank) {
  auto tok = Load(SmallTokenizerJson());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 264);
  EXPECT_THAT(tok->Encode("hello"), ElementsAre(259));
  EXPECT_THAT(tok->Encode("hell"), ElementsAre(258));
  // Leftmost pair first on equal rank: "aaa" -> "aa" "a".
  EXPECT_THAT(tok->Encode("aaa"), ElementsAre(260, 'a'));
  // " w" merges across the pre-tokenizer's leading space; "orld" stays bytes.
  EXPECT_THAT(tok->Encode("hello world"),
              ElementsAre(259, 261, 'o', 'r', 'l', 'd'));
  EXPECT_EQ(tok->Decode(tok->Encode("hello world")), "hello world");
  EXPECT_EQ(tok->TokenToBytes(261), " w");
  EXPECT_EQ(tok->TokenText(261), "Ġw");
}

TEST(TokenizerTest, MergesAsPairs) {
  Json j = SmallTokenizerJson();
  j["model"]["merges"] =
      Json::array({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}});
  auto tok = Load(j);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("hello"), ElementsAre(259));
}

TEST(TokenizerTest, SpecialAndUserDefinedTokens) {
  auto tok = Load(SmallTokenizerJson());
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("<|im_start|>hello"), ElementsAre(262, 259));
  EncodeOptions plain;
  plain.parse_special = false;
  const std::vector<int32_t> as_text = tok->Encode("<|im_start|>", plain);
  EXPECT_EQ(as_text.size(), 12u);
  EXPECT_EQ(tok->Decode(as_text), "<|im_start|>");
  // User-defined tokens are matched even without parse_special.
  EXPECT_THAT(tok->Encode("<tool>", plain), ElementsAre(263));
  EXPECT_TRUE(tok->IsSpecial(262));
  EXPECT_FALSE(tok->IsSpecial(263));
  EXPECT_EQ(tok->Decode(std::vector<int32_t>{262, 259, 263}, true),
            "hello<tool>");
  EXPECT_EQ(tok->Decode(std::vector<int32_t>{-1, 259, 100000}), "hello");
}

TEST(TokenizerTest, LstripRstripSwallowWhitespace) {
  Json j = SmallTokenizerJson();
  j["added_tokens"][0]["lstrip"] = true;
  j["added_tokens"][0]["rstrip"] = true;
  auto tok = Load(j);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("hello  <|im_start|>  hello"),
              ElementsAre(259, 262, 259));
}

TEST(TokenizerTest, PostProcessorAddsBos) {
  Json j = SmallTokenizerJson();
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<|im_start|>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"special_tokens",
       {{"<|im_start|>", {{"id", "<|im_start|>"}, {"ids", {262}}}}}}};
  auto tok = Load(j);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_id(), std::optional<int32_t>(262));
  EXPECT_THAT(tok->Encode("hello"), ElementsAre(262, 259));
  EncodeOptions no_bos;
  no_bos.add_bos = false;
  EXPECT_THAT(tok->Encode("hello", no_bos), ElementsAre(259));
}

TEST(TokenizerTest, ConfigSuppliesBosEosAndTemplate) {
  auto tok =
      Load(SmallTokenizerJson(),
           R"({"bos_token": {"content": "<|im_start|>"}, "eos_token": "<tool>",
                      "add_bos_token": true, "chat_template": "{{ '<|im_start|>' }}"})");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_id(), std::optional<int32_t>(262));
  EXPECT_EQ(tok->eos_id(), std::optional<int32_t>(263));
  EXPECT_TRUE(tok->IsEndOfGeneration(263));
  EXPECT_THAT(tok->Encode("hello"), ElementsAre(262, 259));
  EXPECT_EQ(tok->chat_template_source(), "{{ '<|im_start|>' }}");
}

TEST(TokenizerTest, HfJsonErrors) {
  EXPECT_EQ(Tokenizer::FromHfJsonText("{not json", "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      Tokenizer::FromHfJson("/nonexistent/tokenizer.json").status().code(),
      absl::StatusCode::kNotFound);

  Json j = SmallTokenizerJson();
  j["model"].erase("merges");
  EXPECT_EQ(LoadStatus(j).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(LoadStatus(j).message(), HasSubstr("merges"));

  j = SmallTokenizerJson();
  j["model"]["type"] = "Unigram";
  EXPECT_EQ(LoadStatus(j).code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(LoadStatus(j).message(), HasSubstr("Unigram"));

  j = SmallTokenizerJson();
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  EXPECT_EQ(LoadStatus(j).code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(LoadStatus(j).message(), HasSubstr("Metaspace"));

  j = SmallTokenizerJson();
  j["normalizer"] = {{"type", "NFC"}};
  EXPECT_EQ(LoadStatus(j).code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(LoadStatus(j).message(), HasSubstr("NFC"));

  j = SmallTokenizerJson();
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_THAT(LoadStatus(j).message(), HasSubstr("WordPiece"));

  j = SmallTokenizerJson();
  j["model"]["merges"].push_back("x zz");
  EXPECT_EQ(LoadStatus(j).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(LoadStatus(j).message(), HasSubstr("not in the vocab"));

  j = SmallTokenizerJson();
  j["model"]["merges"].push_back(42);
  EXPECT_EQ(LoadStatus(j).code(), absl::StatusCode::kInvalidArgument);

  j = SmallTokenizerJson();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"},
                           {"pattern", {{"Regex", "(unclosed"}}},
                           {"behavior", "Isolated"}},
                          {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  EXPECT_EQ(LoadStatus(j).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(LoadStatus(j).message(), HasSubstr("(unclosed"));

  j = SmallTokenizerJson();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "x"}}}};
  EXPECT_EQ(LoadStatus(j).code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(LoadStatus(j).message(), HasSubstr("ByteLevel"));

  j = SmallTokenizerJson();
  j["model"]["vocab"]["bad"] = "not an id";
  EXPECT_EQ(LoadStatus(j).code(), absl::StatusCode::kInvalidArgument);
}

// A GGUF with the small vocabulary: ids 0..255 bytes, 256 "he", 257 "<s>".
GgufBuilder SmallGguf(absl::string_view model, absl::string_view pre) {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(byte_level::Encode(std::string(1, static_cast<char>(b))));
    types.push_back(1);
  }
  tokens.push_back("he");
  types.push_back(1);
  tokens.push_back("<s>");
  types.push_back(3);
  GgufBuilder b;
  b.String("tokenizer.ggml.model", model)
      .String("tokenizer.ggml.pre", pre)
      .StringArray("tokenizer.ggml.tokens", tokens)
      .Int32Array("tokenizer.ggml.token_type", types)
      .Uint32("tokenizer.ggml.bos_token_id", 257);
  return b;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> FromBuilder(
    const GgufBuilder& b, std::vector<uint8_t>* keep) {
  *keep = b.Build();
  auto gguf = GgufFile::Parse(*keep);
  if (!gguf.ok()) return gguf.status();
  return Tokenizer::FromGguf(**gguf);
}

TEST(TokenizerGgufTest, SmallVocabulary) {
  std::vector<uint8_t> bytes;
  GgufBuilder b = SmallGguf("gpt2", "smollm");
  b.StringArray("tokenizer.ggml.merges", {"h e"})
      .Bool("tokenizer.ggml.add_bos_token", true);
  auto tok = FromBuilder(b, &bytes);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->Encode("he12"), ElementsAre(257, 256, '1', '2'));
  EncodeOptions no_bos;
  no_bos.add_bos = false;
  EXPECT_THAT((*tok)->Encode("he", no_bos), ElementsAre(256));
  EXPECT_TRUE((*tok)->notes().empty());
}

TEST(TokenizerGgufTest, UnknownPreFallsBackToGpt2WithNote) {
  std::vector<uint8_t> bytes;
  GgufBuilder b = SmallGguf("gpt2", "brand-new-model");
  b.StringArray("tokenizer.ggml.merges", {"h e"});
  auto tok = FromBuilder(b, &bytes);
  ASSERT_TRUE(tok.ok()) << tok.status();
  ASSERT_EQ((*tok)->notes().size(), 1u);
  EXPECT_THAT((*tok)->notes()[0], HasSubstr("brand-new-model"));
  EXPECT_THAT((*tok)->notes()[0], HasSubstr("GPT-2"));
}

TEST(TokenizerGgufTest, Errors) {
  std::vector<uint8_t> bytes;
  GgufBuilder spm = SmallGguf("llama", "default");
  auto s = FromBuilder(spm, &bytes);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.status().message(), HasSubstr("'llama'"));

  auto no_merges = FromBuilder(SmallGguf("gpt2", "gpt-2"), &bytes);
  EXPECT_EQ(no_merges.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_merges.status().message(), HasSubstr("merges"));

  GgufBuilder bad_bos = SmallGguf("gpt2", "gpt-2");
  bad_bos.StringArray("tokenizer.ggml.merges", {"h e"})
      .Uint32("tokenizer.ggml.eos_token_id", 5000);
  auto b = FromBuilder(bad_bos, &bytes);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(b.status().message(), HasSubstr("5000"));

  GgufBuilder bad_merge = SmallGguf("gpt2", "gpt-2");
  bad_merge.StringArray("tokenizer.ggml.merges", {"nospace"});
  EXPECT_EQ(FromBuilder(bad_merge, &bytes).status().code(),
            absl::StatusCode::kInvalidArgument);
}

std::vector<std::string> Pieces(
    absl::string_view pattern, absl::string_view text,
    SplitBehavior behavior = SplitBehavior::kIsolated) {
  auto pre = PreTokenizer::Create({{std::string(pattern), false, behavior}});
  EXPECT_TRUE(pre.ok()) << pre.status();
  std::vector<std::string> pieces;
  (*pre)->Split(text, &pieces);
  return pieces;
}

TEST(PreTokenizerTest, Gpt2Pattern) {
  EXPECT_THAT(Pieces(kGpt2Pattern, "Hello  world's 123!!\n"),
              ElementsAre("Hello", " ", " world", "'s", " 123", "!!", "\n"));
  // \s+(?!\S): the last space of a run goes with the next word.
  EXPECT_THAT(Pieces(kGpt2Pattern, "a   b"), ElementsAre("a", "  ", " b"));
  EXPECT_THAT(Pieces(kGpt2Pattern, "IT'S"), ElementsAre("IT", "'", "S"));
  EXPECT_THAT(Pieces(kLlama3Pattern, "IT'S 12345"),
              ElementsAre("IT", "'S", " ", "123", "45"));
}

TEST(PreTokenizerTest, InvalidBytesBecomeReplacementCharacter) {
  EXPECT_THAT(Pieces(kGpt2Pattern, "a\xFF"), ElementsAre("a", "\xEF\xBF\xBD"));
  EXPECT_THAT(Pieces(kGpt2Pattern, "\xED\xA0\x80"),
              ElementsAre("\xED\xA0\x80"));
}

TEST(PreTokenizerTest, RemovedBehaviorAndBadPattern) {
  EXPECT_THAT(Pieces("\\s+", " a  b ", SplitBehavior::kRemoved),
              ElementsAre("a", "b"));
  EXPECT_THAT(Pieces("x*", "axb"),
              ElementsAre("a", "x", "b"));  // empty matches split nothing
  auto bad = PreTokenizer::Create({{"[", false, SplitBehavior::kIsolated}});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton
