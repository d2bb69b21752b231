#include "common/fault/fault_points.h"

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

TEST(FaultSpecTest, ParsesEveryActionAndHit) {
  auto specs = ParseFaultSpecs(
      "prefill_step:crash,decode_step:stop@3,"
      "prefill_step:error@2");
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 3u);
  EXPECT_EQ((*specs)[0].point, "prefill_step");
  EXPECT_EQ((*specs)[0].action, FaultAction::kCrash);
  EXPECT_EQ((*specs)[0].hit, 1);
  EXPECT_EQ((*specs)[1].action, FaultAction::kStop);
  EXPECT_EQ((*specs)[1].hit, 3);
  EXPECT_EQ((*specs)[2].action, FaultAction::kError);
  EXPECT_EQ((*specs)[2].hit, 2);
  EXPECT_TRUE(ParseFaultSpecs("")->empty());
}

TEST(FaultSpecTest, RefusesWhatItCannotArm) {
  const struct {
    const char* spec;
    const char* message;
  } cases[] = {
      {"prefil_step:crash", "is not one of prefill_step, decode_step"},
      {"prefill_step:explode", "is not one of crash, stop, error"},
      {"prefill_step", "is not POINT:ACTION[@N]"},
      {"prefill_step:crash:1", "is not POINT:ACTION[@N]"},
      {"prefill_step:crash@0", "integer >= 1"},
      {"prefill_step:crash@x", "integer >= 1"},
  };
  for (const auto& c : cases) {
    auto specs = ParseFaultSpecs(c.spec);
    ASSERT_FALSE(specs.ok()) << c.spec;
    EXPECT_EQ(specs.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(specs.status().message(), HasSubstr(c.message)) << c.spec;
  }
}

TEST(FaultPointsTest, ErrorFiresOnceOnTheNamedHit) {
  FaultPoints points;
  EXPECT_TRUE(points.Hit(kFaultPrefillStep).ok());  // unarmed
  points.Arm(*ParseFaultSpecs("prefill_step:error@2"));
  EXPECT_TRUE(points.Hit(kFaultPrefillStep).ok());
  EXPECT_TRUE(points.Hit(kFaultDecodeStep).ok());  // another point
  const absl::Status second = points.Hit(kFaultPrefillStep);
  EXPECT_EQ(second.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(second.message(), HasSubstr("prefill_step (hit 2"));
  EXPECT_TRUE(points.Hit(kFaultPrefillStep).ok());
  points.Arm(*ParseFaultSpecs("prefill_step:error"));  // counts restart
  EXPECT_FALSE(points.Hit(kFaultPrefillStep).ok());
  points.Disarm();
  EXPECT_TRUE(points.Hit(kFaultPrefillStep).ok());
}

// The process actions, in a forked child whose wait status shows them.
TEST(FaultPointsTest, CrashKillsAndStopStopsTheProcess) {
  const pid_t crashing = fork();
  ASSERT_GE(crashing, 0);
  if (crashing == 0) {
    FaultPoints points;
    points.Arm(*ParseFaultSpecs("decode_step:crash"));
    (void)points.Hit(kFaultDecodeStep);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(crashing, &status, 0), crashing);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);

  const pid_t stopping = fork();
  ASSERT_GE(stopping, 0);
  if (stopping == 0) {
    FaultPoints points;
    points.Arm(*ParseFaultSpecs("decode_step:stop"));
    // Continued: the hit returns OK and the process goes on.
    _exit(points.Hit(kFaultDecodeStep).ok() ? 7 : 1);
  }
  ASSERT_EQ(waitpid(stopping, &status, WUNTRACED), stopping);
  ASSERT_TRUE(WIFSTOPPED(status));
  kill(stopping, SIGCONT);
  ASSERT_EQ(waitpid(stopping, &status, 0), stopping);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 7);
}

}  // namespace
}  // namespace baton
