#include "worker/service/callback_gate.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

TEST(CallbackGateTest, RunsUntilClosedAndNeverAfter) {
  CallbackGate gate;
  int calls = 0;
  EXPECT_TRUE(gate.Run([&] { ++calls; }));
  gate.Close();
  EXPECT_FALSE(gate.Run([&] { ++calls; }));
  EXPECT_EQ(calls, 1);
}

TEST(CallbackGateTest, CloseWaitsForTheCallbackInside) {
  CallbackGate gate;
  absl::Notification inside;
  absl::Notification release;
  std::atomic<bool> finished{false};
  std::thread callback([&] {
    gate.Run([&] {
      inside.Notify();
      release.WaitForNotification();
      finished = true;
    });
  });
  inside.WaitForNotification();
  std::thread closer([&] {
    gate.Close();
    // Close returned: the callback has left the gate.
    EXPECT_TRUE(finished.load());
  });
  release.Notify();
  closer.join();
  callback.join();
}

}  // namespace
}  // namespace baton
