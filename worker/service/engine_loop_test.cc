// EngineLoop: an idle loop sleeps until something needs a step, and a KV
// handoff confirmed on a sender thread is such a thing.
#include "worker/service/engine_loop.h"

#include <memory>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "worker/engine/disaggregation_test_util.h"

namespace baton {
namespace {

using disagg_test::DisaggregationTest;
using disagg_test::StuckSink;

using EngineLoopTest = DisaggregationTest;

// No poll for an hour: only the engine's wakeup can report the confirmed
// handoff, and it does at once. The sink holds the transfer's end until
// `release`: the prefill's compute is done and the loop idle meanwhile.
TEST_F(EngineLoopTest, AConfirmedHandoffWakesAnIdleLoop) {
  auto engine = MakeEngine();
  absl::Notification release, first_token, done;
  PrefillOptions options;
  options.make_sink =
      [&](const KvSinkInfo&) -> absl::StatusOr<std::unique_ptr<KvSink>> {
    return std::unique_ptr<KvSink>(std::make_unique<StuckSink>(&release));
  };
  absl::Status error;
  {
    EngineLoop loop(engine.get(), /*idle_poll=*/absl::Hours(1));
    SamplingParams greedy;
    greedy.temperature = 0.0;
    ASSERT_TRUE(engine
                    ->SubmitPrefill({"held", Chat("Hi"), greedy}, options,
                                    [&](const PrefillOutput& o) {
                                      if (o.first_token.has_value()) {
                                        first_token.Notify();
                                      }
                                      if (o.done) {
                                        error = o.error;
                                        done.Notify();
                                      }
                                    })
                    .ok());
    loop.Wake();
    ASSERT_TRUE(first_token.WaitForNotificationWithTimeout(absl::Seconds(60)));
    // The loop is idle now (nothing to compute); the handoff is held.
    EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
    release.Notify();
    // Without the wakeup the report would wait for the hour's poll.
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  }
  EXPECT_TRUE(error.ok()) << error;
  ExpectAllFree(*engine);
}

}  // namespace
}  // namespace baton
