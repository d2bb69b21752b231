#include "worker/sampler/stop_checker.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace baton {
namespace {

struct Outcome {
  std::string text;  // Everything emitted, including Finish() if not stopped.
  bool stopped = false;
};

Outcome RunDeltas(const std::vector<std::string>& stops,
                  const std::vector<std::string>& deltas) {
  StopChecker checker(stops);
  Outcome out;
  for (const std::string& delta : deltas) {
    StopChecker::Result r = checker.Push(delta);
    out.text += r.emit;
    if (r.stopped) {
      out.stopped = true;
      break;
    }
  }
  if (!out.stopped) out.text += checker.Finish();
  return out;
}

TEST(StopCheckerTest, StopSplitAcrossManyDeltas) {
  StopChecker checker({"<|end|>"});
  EXPECT_EQ(checker.Push("Hello <").emit, "Hello ");
  EXPECT_EQ(checker.Push("|e").emit, "");
  EXPECT_EQ(checker.Push("n").emit, "");
  const StopChecker::Result r = checker.Push("d|> tail");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emit, "");
  EXPECT_TRUE(checker.stopped());
  EXPECT_TRUE(checker.Push("more").stopped);
  EXPECT_EQ(checker.Push("more").emit, "");
  EXPECT_EQ(checker.Finish(), "");
}

TEST(StopCheckerTest, FalseStartIsReleased) {
  StopChecker checker({"<|end|>"});
  EXPECT_EQ(checker.Push("a <|e").emit, "a ");
  const StopChecker::Result r = checker.Push("x");
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(r.emit, "<|ex");
}

TEST(StopCheckerTest, OverlappingPrefixes) {
  // "ab" completes first even though "abc" is longer.
  EXPECT_EQ(RunDeltas({"abc", "ab"}, {"xa", "b", "c"}).text, "x");
  EXPECT_TRUE(RunDeltas({"abc", "ab"}, {"xa", "b", "c"}).stopped);
  // "abc" starts earlier than "bcd": the earlier occurrence wins.
  EXPECT_EQ(RunDeltas({"bcd", "abc"}, {"zab", "cd"}).text, "z");
  // Held "ab" (prefix of "abc") then "d" releases everything.
  StopChecker checker({"abc", "abd!"});
  EXPECT_EQ(checker.Push("1ab").emit, "1");
  StopChecker::Result r = checker.Push("d");
  EXPECT_EQ(r.emit, "");  // "abd" is still a prefix of "abd!".
  r = checker.Push("?");
  EXPECT_EQ(r.emit, "abd?");
  EXPECT_FALSE(r.stopped);
}

TEST(StopCheckerTest, StopAtVeryStart) {
  const Outcome out = RunDeltas({"STOP"}, {"STOP", "after"});
  EXPECT_TRUE(out.stopped);
  EXPECT_EQ(out.text, "");
  EXPECT_EQ(RunDeltas({"S"}, {"Sx"}).text, "");
}

TEST(StopCheckerTest, MultiByteUtf8AroundStop) {
  // "é" = C3 A9, "€" = E2 82 AC, "😀" = F0 9F 98 80.
  const Outcome out = RunDeltas({"€€"}, {"caf\xC3", "\xA9 ", "\xE2\x82", "\xAC",
                                         "\xE2\x82\xAC\xF0", "\x9F\x98\x80"});
  EXPECT_TRUE(out.stopped);
  EXPECT_EQ(out.text, "café ");
  // A stop string that is itself multi-byte, split mid-character.
  StopChecker checker({"😀!"});
  EXPECT_EQ(checker.Push("ok \xF0\x9F").emit, "ok ");
  EXPECT_EQ(checker.Push("\x98\x80").emit, "");
  const StopChecker::Result r = checker.Push("?");
  EXPECT_EQ(r.emit, "😀?");
  EXPECT_FALSE(r.stopped);
}

TEST(StopCheckerTest, SeveralStopStrings) {
  const Outcome out =
      RunDeltas({"\n\n", "User:", "###"}, {"Answer: 42", "\nUs", "er: next"});
  EXPECT_TRUE(out.stopped);
  EXPECT_EQ(out.text, "Answer: 42\n");
}

TEST(StopCheckerTest, NoStopEmitsEverythingAfterFinish) {
  StopChecker checker({"</s>", "END"});
  std::string emitted;
  for (const char* d : {"the ", "<", "/", "EN"}) {
    const StopChecker::Result r = checker.Push(d);
    EXPECT_FALSE(r.stopped);
    emitted += r.emit;
  }
  EXPECT_EQ(emitted, "the </");  // "EN" is held back.
  emitted += checker.Finish();
  EXPECT_EQ(emitted, "the </EN");
  EXPECT_EQ(checker.Finish(), "");
  EXPECT_EQ(RunDeltas({}, {"a", "b"}).text, "ab");
  EXPECT_EQ(RunDeltas({""}, {"a", "b"}).text,
            "ab");  // Empty stops are ignored.
}

TEST(StopCheckerTest, RandomTextMatchesCutBeforeFirstStop) {
  std::mt19937_64 rng(424242);
  const std::vector<std::string> alphabet = {
      "a", "b", "c", "\xC3\xA9", "\xE2\x82\xAC", " "};
  auto random_string = [&](size_t min_len, size_t max_len) {
    std::uniform_int_distribution<size_t> len(min_len, max_len);
    std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1);
    std::string s;
    for (size_t n = len(rng); n > 0; --n) s += alphabet[pick(rng)];
    return s;
  };
  int stopped_runs = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<std::string> stops;
    std::uniform_int_distribution<int> num_stops(0, 3);
    size_t longest = 0;
    for (int n = num_stops(rng); n > 0; --n) {
      stops.push_back(random_string(1, 4));
      longest = std::max(longest, stops.back().size());
    }
    const std::string text = random_string(0, 40);
    size_t cut = std::string::npos;
    for (const std::string& stop : stops) cut = std::min(cut, text.find(stop));
    const std::string expected = text.substr(0, cut);

    // Split at random byte offsets, mid-character included.
    StopChecker checker(stops);
    std::string emitted;
    bool stopped = false;
    size_t pos = 0;
    std::uniform_int_distribution<size_t> step(0, 6);
    while (pos < text.size() && !stopped) {
      const size_t n = std::min(step(rng), text.size() - pos);
      const StopChecker::Result r = checker.Push(text.substr(pos, n));
      pos += n;
      emitted += r.emit;
      stopped = r.stopped;
      ASSERT_EQ(expected.compare(0, emitted.size(), emitted), 0)
          << "emitted text is not a prefix of the expected output";
      if (!stopped && longest > 0) {
        // Holds back less than the longest stop string.
        ASSERT_GE(emitted.size() + longest - 1, pos);
      }
    }
    if (!stopped) emitted += checker.Finish();
    ASSERT_EQ(emitted, expected) << "trial " << trial;
    ASSERT_EQ(stopped, cut != std::string::npos) << "trial " << trial;
    stopped_runs += stopped;
  }
  EXPECT_GT(stopped_runs, 300);  // Both outcomes are exercised.
  EXPECT_LT(stopped_runs, 2700);
}

}  // namespace
}  // namespace baton
