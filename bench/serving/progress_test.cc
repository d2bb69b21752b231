#include "bench/serving/progress.h"

#include <sstream>

#include "gtest/gtest.h"

namespace baton::bench {
namespace {

TEST(BenchProgressBarTest, LineShowsCounts) {
  ProgressCounts c{/*total=*/10, /*sent=*/6, /*done=*/5, /*failed=*/1, 2.25};
  EXPECT_EQ(ProgressBar::Line(c),
            "[###############               ] 5/10 done, 1 failed, 1 in "
            "flight, 2.2 s");
}

TEST(BenchProgressBarTest, RateLimitsRedrawsAndFinishesWithANewline) {
  std::ostringstream out;
  ProgressBar bar(out, absl::Hours(1));
  ProgressCounts c{4, 1, 0, 0, 0.0};
  bar.Update(c);
  bar.Update(c);  // within the interval: not drawn
  EXPECT_EQ(out.str(), "\r" + ProgressBar::Line(c));
  c.done = 4;
  c.sent = 4;
  bar.Finish(c);
  bar.Update(c);
  EXPECT_EQ(out.str(), "\r" + ProgressBar::Line({4, 1, 0, 0, 0.0}) + "\r" +
                           ProgressBar::Line(c) + "\n");
}

}  // namespace
}  // namespace baton::bench
