#include "bench/sim/shared_hosts.h"

#include <vector>

#include "gtest/gtest.h"

namespace baton::sim {
namespace {

// The last end `ends` gives for worker `w`.
double EndOf(const std::vector<SharedHosts::End>& ends, int w) {
  double t = -1;
  for (const SharedHosts::End& e : ends) {
    if (e.worker == w) t = e.t;
  }
  return t;
}

TEST(SharedHostsTest, ANeighbourSlowsAStepForAsLongAsItComputes) {
  // Two workers on one host; worker 0 prefills for 1 s alone, worker 1
  // prefills from 0.5 s to its end: worker 0's second half takes 1.1x as
  // long (0.55 s), and once it ends, worker 1 runs alone again.
  SharedHosts hosts({.prefill = 0.1, .decode = 0.5}, 2, 2);
  std::vector<SharedHosts::End> ends;
  hosts.Start(0, 0, 1.0, 0, &ends);
  EXPECT_NEAR(EndOf(ends, 0), 1.0, 1e-12);
  ends.clear();
  hosts.Start(1, 0.5, 1.0, 0, &ends);
  ASSERT_EQ(ends.size(), 2u);
  EXPECT_NEAR(EndOf(ends, 0), 0.5 + 0.5 * 1.1, 1e-12);
  EXPECT_NEAR(EndOf(ends, 1), 0.5 + 1.1, 1e-12);
  // The first end given for worker 0 is no longer its step's end.
  EXPECT_FALSE(hosts.Current(0, 1));
  EXPECT_TRUE(hosts.Current(0, ends[0].version));
  ends.clear();
  hosts.Finish(0, 1.05, &ends);
  ASSERT_EQ(ends.size(), 1u);
  // Worker 1 did 0.55 / 1.1 = half its step beside worker 0; the other
  // half alone.
  EXPECT_NEAR(EndOf(ends, 1), 1.05 + 0.5, 1e-12);
}

TEST(SharedHostsTest, ADecodeStepSlowsBesideAPrefillOnly) {
  SharedHosts hosts({.prefill = 0.1, .decode = 0.5}, 3, 3);
  std::vector<SharedHosts::End> ends;
  hosts.Start(0, 0, 0, 1.0, &ends);  // decode only
  hosts.Start(1, 0, 0, 1.0, &ends);  // decode only: no slowdown
  EXPECT_NEAR(EndOf(ends, 0), 1.0, 1e-12);
  EXPECT_NEAR(EndOf(ends, 1), 1.0, 1e-12);
  ends.clear();
  hosts.Start(2, 0, 1.0, 1.0, &ends);  // prefills and decodes
  // The decode-only steps slow by 0.5 beside the one prefilling; that one,
  // compute-bound throughout, by 0.1 per busy neighbour.
  EXPECT_NEAR(EndOf(ends, 0), 1.5, 1e-12);
  EXPECT_NEAR(EndOf(ends, 1), 1.5, 1e-12);
  EXPECT_NEAR(EndOf(ends, 2), 2.0 * 1.2, 1e-12);
}

TEST(SharedHostsTest, WorkersOfOtherHostsDoNotMove) {
  SharedHosts hosts({.prefill = 0.1, .decode = 0.1}, 2, 1);
  std::vector<SharedHosts::End> ends;
  hosts.Start(0, 0, 1.0, 0, &ends);
  ends.clear();
  hosts.Start(1, 0.5, 1.0, 0, &ends);
  ASSERT_EQ(ends.size(), 1u);
  EXPECT_NEAR(EndOf(ends, 1), 1.5, 1e-12);
}

}  // namespace
}  // namespace baton::sim
