#include "coordinator/admission.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::coordinator {
namespace {

using ::testing::HasSubstr;

constexpr char kModel[] = "smollm2-135m";

WorkerInfo Worker(absl::string_view id, WorkerRole role, int64_t queued,
                  double rate, WorkerHealth health = WorkerHealth::kHealthy) {
  WorkerInfo w;
  w.ref = WorkerRef{std::string(id), 1};
  w.registration.role = role;
  w.registration.address = absl::StrCat(id, ":1");
  w.registration.model_id = kModel;
  w.registration.kv_layout.block_size = 16;
  w.registration.kv_blocks_total = 100;
  w.health = health;
  w.load.queued_prefill_tokens = queued;
  w.load.prefill_tokens_per_second = rate;
  w.load.kv_blocks_free = 100;
  w.load.kv_blocks_total = 100;
  return w;
}

RequestInfo Request(int64_t prompt) {
  RequestInfo info;
  info.model_id = kModel;
  info.prompt_tokens = prompt;
  info.max_tokens = 16;
  return info;
}

AdmissionOptions Slo(int ms, int64_t max_waiting = 0) {
  AdmissionOptions o;
  o.ttft_slo = absl::Milliseconds(ms);
  o.max_waiting_requests = max_waiting;
  return o;
}

TEST(AdmissionTest, EstimateIsQueuedPlusUncachedOverTheMeasuredRate) {
  const WorkerInfo w = Worker("w1", WorkerRole::kBoth, 900, 1000);
  RequestInfo r = Request(100);
  EXPECT_EQ(EstimateTtft(w, r), absl::Seconds(1));
  r.cached_tokens["w1"] = 60;
  EXPECT_EQ(EstimateTtft(w, r), absl::Milliseconds(940));
  r.cached_tokens["w1"] = 500;  // more than the prompt: never negative
  EXPECT_EQ(EstimateTtft(w, r), absl::Milliseconds(900));
  EXPECT_EQ(EstimateTtft(Worker("w2", WorkerRole::kBoth, 0, 0), r),
            absl::InfiniteDuration());
}

TEST(AdmissionTest, RefusesAboveTheSloWithTheFiguresAndARetryDelay) {
  const Candidates c = {Worker("w1", WorkerRole::kBoth, 2900, 1000),
                        Worker("w2", WorkerRole::kBoth, 4000, 1000)};
  const AdmissionVerdict v = Admit(Slo(500), c, Request(100), 0);
  EXPECT_EQ(v.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(v.reason, "ttft_slo");
  EXPECT_EQ(v.estimated_ttft, absl::Seconds(3));  // the better worker's
  EXPECT_EQ(v.retry_after, absl::Seconds(3));     // 2.5 s over, rounded up
  EXPECT_THAT(v.status.message(), HasSubstr("3000 ms"));
  EXPECT_THAT(v.status.message(), HasSubstr("w1"));
  EXPECT_THAT(v.status.message(), HasSubstr("--ttft_slo_ms"));
  EXPECT_THAT(v.status.message(), HasSubstr("500 ms"));

  // Within the SLO on the less loaded worker: admitted.
  const AdmissionVerdict ok = Admit(Slo(3000), c, Request(100), 0);
  EXPECT_TRUE(ok.status.ok()) << ok.status;
  EXPECT_EQ(ok.reason, "");
  EXPECT_EQ(ok.estimated_ttft, absl::Seconds(3));
}

TEST(AdmissionTest, RetryDelayIsAtLeastOneSecond) {
  const Candidates c = {Worker("w1", WorkerRole::kBoth, 550, 1000)};
  const AdmissionVerdict v = Admit(Slo(500), c, Request(50), 0);
  EXPECT_EQ(v.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(v.retry_after, absl::Seconds(1));
}

TEST(AdmissionTest, NoEstimateWhileAWorkerHasNotMeasuredItsRate) {
  const Candidates c = {Worker("w1", WorkerRole::kBoth, 90000, 1000),
                        Worker("w2", WorkerRole::kBoth, 90000, 0)};
  const AdmissionVerdict v = Admit(Slo(100), c, Request(100), 0);
  EXPECT_TRUE(v.status.ok()) << v.status;
  EXPECT_EQ(v.estimated_ttft, absl::InfiniteDuration());
}

TEST(AdmissionTest, SloZeroIsOff) {
  const Candidates c = {Worker("w1", WorkerRole::kBoth, 90000, 10)};
  EXPECT_TRUE(Admit(Slo(0), c, Request(100), 0).status.ok());
}

TEST(AdmissionTest, SplitServingEstimatesOnPrefillWorkersOnly) {
  // A `both` worker idles, but requests go to the prefill-role pool while
  // a prefill worker is up; without one they go to the `both` worker.
  Candidates c = {Worker("p1", WorkerRole::kPrefill, 5000, 1000),
                  Worker("b1", WorkerRole::kBoth, 0, 1000),
                  Worker("d1", WorkerRole::kDecode, 0, 0)};
  EXPECT_EQ(Admit(Slo(1000), c, Request(100), 0).status.code(),
            absl::StatusCode::kResourceExhausted);
  c[0].health = WorkerHealth::kSuspect;
  EXPECT_TRUE(Admit(Slo(1000), c, Request(100), 0).status.ok());
}

TEST(AdmissionTest, SkipsUnhealthyAndOtherModelsAndAdmitsOnAnEmptyPool) {
  Candidates c = {
      Worker("w1", WorkerRole::kBoth, 0, 1000, WorkerHealth::kDraining),
      Worker("w2", WorkerRole::kBoth, 9000, 1000)};
  EXPECT_EQ(Admit(Slo(1000), c, Request(100), 0).reason, "ttft_slo");
  c[1].registration.model_id = "other";
  // No eligible worker: admitted, so the route names what is missing.
  const AdmissionVerdict v = Admit(Slo(1000), c, Request(100), 0);
  EXPECT_TRUE(v.status.ok()) << v.status;
}

TEST(AdmissionTest, FullQueueRefusesBeforeAnyEstimate) {
  const Candidates c = {Worker("w1", WorkerRole::kBoth, 0, 1000)};
  const AdmissionVerdict v = Admit(Slo(0, 8), c, Request(100), 8);
  EXPECT_EQ(v.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(v.reason, "queue_full");
  EXPECT_EQ(v.retry_after, absl::Seconds(1));
  EXPECT_THAT(v.status.message(), HasSubstr("8 requests"));
  EXPECT_THAT(v.status.message(), HasSubstr("--max_waiting_requests"));
  EXPECT_TRUE(Admit(Slo(0, 8), c, Request(100), 7).status.ok());
  EXPECT_TRUE(Admit(Slo(0, 0), c, Request(100), 100000).status.ok());
}

TEST(AdmissionTest, TooManyRunningStreamsAreRefused) {
  const Candidates c = {Worker("w1", WorkerRole::kBoth, 0, 1000)};
  AdmissionOptions options;
  options.max_waiting_requests = 0;
  options.max_running_requests = 3;
  const AdmissionVerdict v = Admit(options, c, Request(100), 0, 3);
  EXPECT_EQ(v.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(v.reason, "running_full");
  EXPECT_EQ(v.retry_after, absl::Seconds(1));
  EXPECT_THAT(v.status.message(), HasSubstr("3 requests are running"));
  EXPECT_THAT(v.status.message(), HasSubstr("--max_running_requests"));
  EXPECT_TRUE(Admit(options, c, Request(100), 0, 2).status.ok());
  options.max_running_requests = 0;
  EXPECT_TRUE(Admit(options, c, Request(100), 0, 1000000).status.ok());
}

TEST(AdmissionTest, OptionsAreValidated) {
  EXPECT_TRUE(ValidateAdmissionOptions(AdmissionOptions{}).ok());
  AdmissionOptions bad;
  bad.ttft_slo = absl::Milliseconds(-1);
  EXPECT_THAT(ValidateAdmissionOptions(bad).message(), HasSubstr("ttft_slo"));
  bad = AdmissionOptions{};
  bad.max_waiting_requests = -1;
  EXPECT_THAT(ValidateAdmissionOptions(bad).message(),
              HasSubstr("max_waiting_requests"));
  bad = AdmissionOptions{};
  bad.max_running_requests = -1;
  EXPECT_THAT(ValidateAdmissionOptions(bad).message(),
              HasSubstr("max_running_requests"));
}

}  // namespace
}  // namespace baton::coordinator
