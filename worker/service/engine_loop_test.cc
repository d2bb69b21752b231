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

// Holds the transfer's end until `release`: the prefill's compute is done
// and its engine idle, waiting only for the handoff's confirmation.
class HeldSink : public KvSink {
 public:
  explicit HeldSink(absl::Notification* release) : release_(release) {}
  absl::Status SendLayer(int64_t, std::span<const uint8_t>) override {
    return absl::OkStatus();
  }
  absl::Status Finish() override {
    release_->WaitForNotification();
    return absl::OkStatus();
  }
  void Abort(absl::Status) override {}

 private:
  absl::Notification* release_;
};

using EngineLoopTest = DisaggregationTest;

// No poll for an hour: only the engine's wakeup can report the confirmed
// handoff, and it does at once.
TEST_F(EngineLoopTest, AConfirmedHandoffWakesAnIdleLoop) {
  auto engine = MakeEngine();
  absl::Notification release, first_token, done;
  PrefillOptions options;
  options.make_sink =
      [&](const KvSinkInfo&) -> absl::StatusOr<std::unique_ptr<KvSink>> {
    return std::unique_ptr<KvSink>(std::make_unique<HeldSink>(&release));
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
