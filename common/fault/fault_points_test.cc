#include "common/fault/fault_points.h"

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

TEST(FaultSpecTest, ParsesEveryActionAndHit) {
  auto specs = ParseFaultSpecs(
      "prefill_step:crash,decode_step:stop@3,"
      "prefill_step:error@2,decode_step:hang");
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 4u);
  EXPECT_EQ((*specs)[0].point, "prefill_step");
  EXPECT_EQ((*specs)[0].action, FaultAction::kCrash);
  EXPECT_EQ((*specs)[0].hit, 1);
  EXPECT_EQ((*specs)[1].action, FaultAction::kStop);
  EXPECT_EQ((*specs)[1].hit, 3);
  EXPECT_EQ((*specs)[2].action, FaultAction::kError);
  EXPECT_EQ((*specs)[2].hit, 2);
  EXPECT_EQ((*specs)[3].action, FaultAction::kHang);
  EXPECT_TRUE(ParseFaultSpecs("")->empty());
}

TEST(FaultSpecTest, RefusesWhatItCannotArm) {
  const struct {
    const char* spec;
    const char* message;
  } cases[] = {
      {"prefil_step:crash",
       "is not one of prefill_step, decode_step, kv_layer_sent"},
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

// hang: the hitting thread never returns while the rest of the process goes
// on (here: writes to a pipe); only a signal ends it.
TEST(FaultPointsTest, HangBlocksOnlyTheHittingThread) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t hanging = fork();
  ASSERT_GE(hanging, 0);
  if (hanging == 0) {
    close(fds[0]);
    static FaultPoints points;
    points.Arm(*ParseFaultSpecs("decode_step:hang"));
    std::thread engine([] {
      (void)points.Hit(kFaultDecodeStep);
      _exit(1);  // a hit that returned
    });
    engine.detach();
    for (int i = 0; i < 3; ++i) {
      usleep(100 * 1000);
      if (write(fds[1], "a", 1) != 1) _exit(2);
    }
    for (;;) pause();
  }
  close(fds[1]);
  char buf[3];
  size_t got = 0;
  while (got < sizeof(buf)) {
    const ssize_t n = read(fds[0], buf + got, sizeof(buf) - got);
    ASSERT_GT(n, 0) << "the process stopped writing";
    got += static_cast<size_t>(n);
  }
  int status = 0;
  EXPECT_EQ(waitpid(hanging, &status, WNOHANG), 0) << "it ended on its own";
  kill(hanging, SIGKILL);
  ASSERT_EQ(waitpid(hanging, &status, 0), hanging);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  close(fds[0]);
}

}  // namespace
}  // namespace baton
