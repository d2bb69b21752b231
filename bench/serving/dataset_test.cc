#include "bench/serving/dataset.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/test_util.h"
#include "gtest/gtest.h"

namespace baton::bench {
namespace {

// One token per word; a chat adds 3 template tokens (as the stub server).
class WordCounter final : public TokenCounter {
 public:
  absl::StatusOr<int> CountText(absl::string_view text) override {
    ++calls;
    return Words(text);
  }
  absl::StatusOr<int> CountChat(absl::string_view text) override {
    ++calls;
    return Words(text) + 3;
  }
  static int Words(absl::string_view text) {
    return static_cast<int>(std::vector<absl::string_view>(
                                absl::StrSplit(text, ' ', absl::SkipEmpty()))
                                .size());
  }
  int calls = 0;
};

std::string SamplePath() {
  return baton::testing::SourceDir() +
         "/bench/serving/testdata/sharegpt_sample.json";
}

std::string WriteTemp(const std::string& name, const std::string& contents) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << contents;
  return path;
}

TEST(BenchRandomDatasetTest, LengthsAndIdsStayInRange) {
  RandomDatasetOptions o;
  o.num_prompts = 400;
  o.input_len = 100;
  o.output_len = 20;
  o.range_ratio = 0.5;
  o.vocab_begin = 1000;
  o.vocab_end = 1100;
  auto prompts = SampleRandomPrompts(o, 5);
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  ASSERT_EQ(prompts->size(), 400u);
  std::set<int> input_lens;
  double output_sum = 0;
  for (const BenchPrompt& p : *prompts) {
    EXPECT_GE(p.input_len, 50);
    EXPECT_LE(p.input_len, 150);
    EXPECT_GE(p.output_len, 10);
    EXPECT_LE(p.output_len, 30);
    EXPECT_EQ(p.token_ids.size(), static_cast<size_t>(p.input_len));
    EXPECT_TRUE(p.chat_text.empty());
    for (int32_t id : p.token_ids) {
      ASSERT_GE(id, 1000);
      ASSERT_LT(id, 1100);
    }
    input_lens.insert(p.input_len);
    output_sum += p.output_len;
  }
  EXPECT_GT(input_lens.size(), 50u);  // spread over the range
  EXPECT_NEAR(output_sum / 400, 20, 1.0);
}

TEST(BenchRandomDatasetTest, ZeroRatioGivesExactLengthsAndSeedReproduces) {
  RandomDatasetOptions o;
  o.num_prompts = 8;
  o.input_len = 33;
  o.output_len = 7;
  auto a = SampleRandomPrompts(o, 9);
  auto b = SampleRandomPrompts(o, 9);
  auto c = SampleRandomPrompts(o, 10);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].input_len, 33);
    EXPECT_EQ((*a)[i].output_len, 7);
    EXPECT_EQ((*a)[i].token_ids, (*b)[i].token_ids);
  }
  EXPECT_NE((*a)[0].token_ids, (*c)[0].token_ids);
}

// Shared-prefix mode: every prompt opens with the same prefix_len tokens,
// then its own input_len; without a prefix the prompts are those drawn
// before (the prefix takes no draws).
TEST(BenchRandomDatasetTest, PrefixLenSharesTheFirstTokensOfEveryPrompt) {
  RandomDatasetOptions o;
  o.num_prompts = 6;
  o.input_len = 20;
  o.output_len = 4;
  auto plain = SampleRandomPrompts(o, 3);
  o.prefix_len = 48;
  auto shared = SampleRandomPrompts(o, 3);
  o.prefix_len = 0;
  auto again = SampleRandomPrompts(o, 3);
  ASSERT_TRUE(plain.ok() && shared.ok() && again.ok());
  for (size_t i = 0; i < shared->size(); ++i) {
    const BenchPrompt& p = (*shared)[i];
    EXPECT_EQ(p.input_len, 68);
    ASSERT_EQ(p.token_ids.size(), 68u);
    EXPECT_TRUE(std::equal(p.token_ids.begin(), p.token_ids.begin() + 48,
                           (*shared)[0].token_ids.begin()));
    EXPECT_EQ((*again)[i].token_ids, (*plain)[i].token_ids);
  }
  EXPECT_NE(std::vector<int32_t>((*shared)[0].token_ids.begin() + 48,
                                 (*shared)[0].token_ids.end()),
            std::vector<int32_t>((*shared)[1].token_ids.begin() + 48,
                                 (*shared)[1].token_ids.end()));
}

TEST(BenchRandomDatasetTest, RejectsBadOptions) {
  const auto code = [](auto mutate) {
    RandomDatasetOptions o;
    mutate(o);
    return SampleRandomPrompts(o, 0).status().code();
  };
  const auto kBad = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(code([](auto& o) { o.range_ratio = 1.0; }), kBad);
  EXPECT_EQ(code([](auto& o) { o.range_ratio = -0.1; }), kBad);
  EXPECT_EQ(code([](auto& o) { o.input_len = 0; }), kBad);
  EXPECT_EQ(code([](auto& o) { o.output_len = 0; }), kBad);
  EXPECT_EQ(code([](auto& o) { o.num_prompts = 0; }), kBad);
  EXPECT_EQ(code([](auto& o) { o.prefix_len = -1; }), kBad);
  EXPECT_EQ(code([](auto& o) { o.vocab_end = o.vocab_begin; }), kBad);
}

TEST(BenchShareGptTest, TakesFirstTurnsAndCountsMalformedEntries) {
  WordCounter counter;
  ShareGptOptions o;
  o.path = SamplePath();
  o.num_prompts = 30;  // more than the 20 usable: some repeat
  o.min_len = 1;
  auto sample = SampleShareGpt(o, counter, 3);
  ASSERT_TRUE(sample.ok()) << sample.status();
  EXPECT_EQ(sample->entries_total, 24);
  EXPECT_EQ(sample->entries_malformed, 4);
  EXPECT_EQ(sample->entries_filtered, 0);
  EXPECT_EQ(sample->prompts_repeated, 10);
  ASSERT_EQ(sample->prompts.size(), 30u);
  for (const BenchPrompt& p : sample->prompts) {
    EXPECT_TRUE(p.token_ids.empty());
    EXPECT_EQ(p.input_len, WordCounter::Words(p.chat_text) + 3);
    EXPECT_GE(p.output_len, 8);
    EXPECT_LE(p.output_len, 60);
    EXPECT_NE(p.chat_text, "and then?");
  }
  // Same seed, same order; another seed, another order.
  auto again = SampleShareGpt(o, counter, 3);
  auto other = SampleShareGpt(o, counter, 4);
  EXPECT_EQ(again->prompts[0].chat_text, sample->prompts[0].chat_text);
  EXPECT_NE(other->prompts[0].chat_text, sample->prompts[0].chat_text);
}

TEST(BenchShareGptTest, LengthBoundsAndFixedOutputLength) {
  WordCounter counter;
  ShareGptOptions o;
  o.path = SamplePath();
  o.num_prompts = 5;
  o.output_len = 12;
  o.max_prompt_len = 25;  // prompts of 9..43 tokens: some filtered
  auto sample = SampleShareGpt(o, counter, 1);
  ASSERT_TRUE(sample.ok()) << sample.status();
  EXPECT_GT(sample->entries_filtered, 0);
  for (const BenchPrompt& p : sample->prompts) {
    EXPECT_EQ(p.output_len, 12);
    EXPECT_LE(p.input_len, 25);
  }
}

TEST(BenchShareGptTest, MalformedFilesFailClearly) {
  WordCounter counter;
  ShareGptOptions o;
  o.num_prompts = 2;
  o.path = WriteTemp("bad.json", "[{\"conversations\": [");
  absl::Status s = SampleShareGpt(o, counter, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not valid JSON"), absl::string_view::npos) << s;

  o.path = WriteTemp("object.json", "{\"conversations\": []}");
  s = SampleShareGpt(o, counter, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("JSON array"), absl::string_view::npos) << s;

  o.path = WriteTemp("empty.json", "[{\"id\": 1}, []]");
  s = SampleShareGpt(o, counter, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("no usable conversation"), absl::string_view::npos)
      << s;

  o.path = ::testing::TempDir() + "/does-not-exist.json";
  EXPECT_EQ(SampleShareGpt(o, counter, 0).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(BenchShareGptTest, TokenizerErrorsPropagate) {
  class Failing final : public TokenCounter {
   public:
    absl::StatusOr<int> CountText(absl::string_view) override {
      return absl::UnavailableError("tokenizer down");
    }
    absl::StatusOr<int> CountChat(absl::string_view) override {
      return absl::UnavailableError("tokenizer down");
    }
  } failing;
  ShareGptOptions o;
  o.path = SamplePath();
  o.num_prompts = 2;
  EXPECT_EQ(SampleShareGpt(o, failing, 0).status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace baton::bench
