#include "model/tokenizer/utf8.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/tokenizer/byte_level.h"

namespace baton {
namespace {

using ::testing::ElementsAre;

std::vector<uint32_t> Lenient(absl::string_view s) {
  std::vector<uint32_t> out;
  utf8::DecodeLenient(s, &out);
  return out;
}

TEST(Utf8Test, LenientDecodingFollowsLlamaCpp) {
  EXPECT_THAT(Lenient("a\xC3\xA9"), ElementsAre('a', 0xE9));
  EXPECT_THAT(Lenient("\x80"), ElementsAre(0xFFFD));
  EXPECT_THAT(Lenient("\xC3"), ElementsAre(0xFFFD));
  EXPECT_THAT(Lenient("\xE2\x82x"), ElementsAre(0xFFFD, 0xFFFD, 'x'));
  EXPECT_THAT(Lenient("\xFF\xF8"), ElementsAre(0xFFFD, 0xFFFD));
  // Overlong forms and surrogates decode by bit pattern.
  EXPECT_THAT(Lenient(absl::string_view("\xC0\x80", 2)), ElementsAre(0));
  EXPECT_THAT(Lenient("\xED\xA0\x80"), ElementsAre(0xD800));
  EXPECT_THAT(Lenient("\xF7\xBF\xBF\xBF"), ElementsAre(0x1FFFFF));
}

TEST(Utf8Test, EncodeRoundTripsEveryCodepointLength) {
  for (uint32_t cpt :
       {0u, 0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xFFFFu, 0x10000u, 0x10FFFFu}) {
    std::string s;
    utf8::AppendEncoded(cpt, &s);
    EXPECT_EQ(static_cast<int>(s.size()), utf8::EncodedLength(cpt));
    EXPECT_THAT(Lenient(s), ElementsAre(cpt));
  }
}

TEST(Utf8Test, StrictValidation) {
  EXPECT_TRUE(utf8::IsValid(""));
  EXPECT_TRUE(utf8::IsValid("héllo 😀"));
  EXPECT_FALSE(utf8::IsValid("\xC0\xAF"));          // overlong
  EXPECT_FALSE(utf8::IsValid("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(utf8::IsValid("\xF4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(utf8::IsValid("\xF0\x9F\x98"));      // truncated
  EXPECT_EQ(utf8::ScanOne("\xF0\x9F\x98").kind, utf8::SeqKind::kIncomplete);
  EXPECT_EQ(utf8::ScanOne("\xF0\x9F\x98x").length, 3);
}

TEST(Utf8Test, SanitizeReplacesMaximalSubparts) {
  std::string out;
  EXPECT_EQ(utf8::AppendSanitized("a\xF0\x9F\x98x\xFF", false, &out), 6u);
  EXPECT_EQ(out, "a\xEF\xBF\xBDx\xEF\xBF\xBD");
  out.clear();
  EXPECT_EQ(utf8::AppendSanitized("ab\xE2\x82", true, &out), 2u);
  EXPECT_EQ(out, "ab");
}

TEST(ByteLevelTest, Gpt2Alphabet) {
  EXPECT_EQ(byte_level::ByteToCodepoint(' '), 0x120u);   // Ġ
  EXPECT_EQ(byte_level::ByteToCodepoint('\n'), 0x10Au);  // Ċ
  EXPECT_EQ(byte_level::ByteToCodepoint('A'), static_cast<uint32_t>('A'));
  EXPECT_EQ(byte_level::ByteToCodepoint(0xAD), 0x143u);
  EXPECT_EQ(byte_level::CodepointToByte(0x4E00), -1);
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string text = byte_level::Encode(all);
  EXPECT_TRUE(utf8::IsValid(text));
  std::string back;
  EXPECT_TRUE(byte_level::Decode(text, &back));
  EXPECT_EQ(back, all);
  back.clear();
  EXPECT_FALSE(byte_level::Decode("a中", &back));
  EXPECT_EQ(back, "a中");
}

}  // namespace
}  // namespace baton
