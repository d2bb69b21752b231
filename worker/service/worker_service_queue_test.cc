// ReserveKv calls that find no KV room wait on the worker for it
// (ReserveKvRequest.queue_ms) and are served in the order their requests
// reached the cluster (arrival_unix_micros; unstamped: here): a later call
// never takes room an earlier one waits for, one without queue_ms is refused
// while others wait, and a waiting call leaves the line when its queue_ms
// runs out, when its caller goes, or when the line is full.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/service/worker_service_test_fixture.h"

namespace baton::worker_service_test {
namespace {

using ::testing::HasSubstr;

// 600 tokens: 38 of the fixture engine's 64 blocks of 16, so one at a time.
v1::ReserveKvRequest Big(const std::string& id, double queue_ms) {
  v1::ReserveKvRequest reserve;
  reserve.set_request_id(id);
  reserve.set_num_prompt_tokens(400);
  reserve.set_max_tokens(200);
  reserve.set_queue_ms(queue_ms);
  return reserve;
}

// A ReserveKv on its own thread and channel; done() once answered.
class PendingReserve {
 public:
  PendingReserve(const TestWorker& worker, v1::ReserveKvRequest request,
                 std::chrono::milliseconds deadline = std::chrono::seconds(60))
      : stub_(v1::Worker::NewStub(grpc::CreateChannel(
            worker.address, grpc::InsecureChannelCredentials()))),
        thread_([this, request = std::move(request), deadline] {
          grpc::ClientContext context;
          context.set_deadline(std::chrono::system_clock::now() + deadline);
          v1::ReserveKvResponse response;
          status_ = stub_->ReserveKv(&context, request, &response);
          done_.store(true);
        }) {}
  ~PendingReserve() { Join(); }
  bool done() const { return done_.load(); }
  const grpc::Status& Join() {
    if (thread_.joinable()) thread_.join();
    return status_;
  }

 private:
  const std::unique_ptr<v1::Worker::Stub> stub_;
  grpc::Status status_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// Polls (up to 10 s) until `done` holds.
template <typename F>
bool Within10s(F done) {
  for (int i = 0; i < 1000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

grpc::Status Reserve(TestWorker& worker, const v1::ReserveKvRequest& request) {
  auto context = Context();
  v1::ReserveKvResponse response;
  return worker.stub->ReserveKv(context.get(), request, &response);
}

void CancelOn(TestWorker& worker, const std::string& id) {
  v1::CancelRequest cancel;
  cancel.set_request_id(id);
  v1::CancelResponse cancelled;
  auto context = Context();
  ASSERT_TRUE(worker.stub->Cancel(context.get(), cancel, &cancelled).ok());
  EXPECT_TRUE(cancelled.found()) << id;
}

TEST_F(WorkerServiceTest, ReservationsWaitForRoomInArrivalOrder) {
  auto decode = StartWorker(
      v1::WORKER_ROLE_DECODE, nullptr,
      [](Engine&, WorkerServiceOptions& o) { o.max_queued_reservations = 2; });
  ASSERT_NE(decode, nullptr);
  TestWorker& w = *decode;
  ASSERT_TRUE(Reserve(w, Big("a", 0)).ok());
  // No room: refused at once without queue_ms.
  const grpc::Status refused = Reserve(w, Big("x", 0));
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  PendingReserve b(w, Big("b", 60000));
  ASSERT_TRUE(Within10s([&] { return w.Load().queued_reservations() == 1; }));
  // Others wait: a call without queue_ms is refused, naming them.
  const grpc::Status behind = Reserve(w, Big("y", 0));
  EXPECT_EQ(behind.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(behind.error_message(), HasSubstr("1 reservations wait"));
  PendingReserve d(w, Big("d", 60000));
  ASSERT_TRUE(Within10s([&] { return w.Load().queued_reservations() == 2; }));
  // The line is full (max_queued_reservations 2).
  const grpc::Status full = Reserve(w, Big("z", 60000));
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(full.error_message(), HasSubstr("limit 2"));

  // Room frees: the first in line gets it, the second still waits.
  CancelOn(w, "a");
  const grpc::Status b_status = b.Join();
  EXPECT_TRUE(b_status.ok()) << b_status.error_message();
  EXPECT_FALSE(d.done());
  EXPECT_EQ(w.Load().queued_reservations(), 1);

  // Behind d: one whose queue_ms runs out, then one whose caller goes.
  PendingReserve short_wait(w, Big("e", 300));
  EXPECT_EQ(short_wait.Join().error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(short_wait.Join().error_message(), HasSubstr("queue_ms ran out"));
  PendingReserve gone(w, Big("f", 60000), std::chrono::milliseconds(300));
  EXPECT_EQ(gone.Join().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(Within10s([&] { return w.Load().queued_reservations() == 1; }));
  EXPECT_FALSE(d.done());

  CancelOn(w, "b");
  const grpc::Status d_status = d.Join();
  EXPECT_TRUE(d_status.ok()) << d_status.error_message();
  EXPECT_EQ(w.Load().queued_reservations(), 0);
  CancelOn(w, "d");
  const v1::WorkerLoad load = w.WaitAllFree();
  EXPECT_EQ(load.kv_blocks_free(), load.kv_blocks_total());
}

// The line is in the order the requests reached the cluster
// (ReserveKvRequest.arrival_unix_micros), not the order their calls reached
// the worker: a call that comes after another but whose request arrived
// first is served first. An unstamped call is keyed by its arrival here.
TEST_F(WorkerServiceTest,
       WaitingReservationsAreServedInTheOrderRequestsArrived) {
  auto decode = StartWorker(v1::WORKER_ROLE_DECODE);
  ASSERT_NE(decode, nullptr);
  TestWorker& w = *decode;
  ASSERT_TRUE(Reserve(w, Big("a", 0)).ok());
  const int64_t now = absl::ToUnixMicros(absl::Now());
  v1::ReserveKvRequest second = Big("second", 60000);
  second.set_arrival_unix_micros(now - 1'000'000);
  v1::ReserveKvRequest first = Big("first", 60000);
  first.set_arrival_unix_micros(now - 2'000'000);
  PendingReserve unstamped_call(w, Big("unstamped", 60000));
  ASSERT_TRUE(Within10s([&] { return w.Load().queued_reservations() == 1; }));
  PendingReserve second_call(w, second);
  ASSERT_TRUE(Within10s([&] { return w.Load().queued_reservations() == 2; }));
  PendingReserve first_call(w, first);
  ASSERT_TRUE(Within10s([&] { return w.Load().queued_reservations() == 3; }));
  // One at a time as room frees: first, second, then the unstamped one
  // (keyed by its arrival here, after both stamps).
  const std::pair<const char*, PendingReserve*> order[] = {
      {"a", &first_call}, {"first", &second_call}, {"second", &unstamped_call}};
  for (const auto& [holder, next] : order) {
    SCOPED_TRACE(holder);
    CancelOn(w, holder);
    const grpc::Status status = next->Join();
    EXPECT_TRUE(status.ok()) << status.error_message();
  }
  EXPECT_EQ(w.Load().queued_reservations(), 0);
  CancelOn(w, "unstamped");
  const v1::WorkerLoad load = w.WaitAllFree();
  EXPECT_EQ(load.kv_blocks_free(), load.kv_blocks_total());
}

// A worker stopping with calls in line answers them (UNAVAILABLE or
// CANCELLED) instead of leaving them hanging.
TEST_F(WorkerServiceTest, StoppingWorkerAnswersWaitingReservations) {
  auto decode = StartWorker(v1::WORKER_ROLE_DECODE);
  ASSERT_NE(decode, nullptr);
  ASSERT_TRUE(Reserve(*decode, Big("a", 0)).ok());
  PendingReserve b(*decode, Big("b", 60000));
  ASSERT_TRUE(
      Within10s([&] { return decode->Load().queued_reservations() == 1; }));
  decode.reset();
  const grpc::StatusCode code = b.Join().error_code();
  EXPECT_TRUE(code == grpc::StatusCode::UNAVAILABLE ||
              code == grpc::StatusCode::CANCELLED)
      << b.Join().error_message();
}

// The times a call carries are checked, never clamped: NaN, negative and
// past-an-hour values are refused naming the field, reserving nothing.
TEST_F(WorkerServiceTest, ReservationTimesOutOfRangeAreRefused) {
  auto decode = StartWorker(v1::WORKER_ROLE_DECODE);
  ASSERT_NE(decode, nullptr);
  for (double bad : {std::nan(""), -5.0, 3.6e6 + 1, HUGE_VAL}) {
    SCOPED_TRACE(bad);
    v1::ReserveKvRequest queue = Big("q", bad);
    const grpc::Status queued = Reserve(*decode, queue);
    EXPECT_EQ(queued.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(queued.error_message(), HasSubstr("queue_ms"));
    v1::ReserveKvRequest ttl = Big("t", 0);
    ttl.set_reservation_ttl_ms(bad);
    const grpc::Status lived = Reserve(*decode, ttl);
    EXPECT_EQ(lived.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(lived.error_message(), HasSubstr("reservation_ttl_ms"));
  }
  v1::WorkerLoad load = decode->Load();
  EXPECT_EQ(load.kv_blocks_free(), load.kv_blocks_total());
  EXPECT_EQ(load.kv_blocks_reserved(), 0);

  // A good reservation shows in kv_blocks_reserved until it is freed.
  ASSERT_TRUE(Reserve(*decode, Big("a", 0)).ok());
  load = decode->Load();
  EXPECT_EQ(load.kv_blocks_reserved(), 38);
  EXPECT_EQ(load.kv_blocks_free(), load.kv_blocks_total() - 38);
  CancelOn(*decode, "a");
  load = decode->WaitAllFree();
  EXPECT_EQ(load.kv_blocks_reserved(), 0);
  EXPECT_EQ(load.kv_blocks_free(), load.kv_blocks_total());
}

}  // namespace
}  // namespace baton::worker_service_test
