// Real clusters on loopback whose workers die (SIGKILL) or freeze (SIGSTOP)
// mid-request. After each, every surviving worker must report
// kv_blocks_free == kv_blocks_total and no leased request.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/cluster/cluster_fault_util.h"
#include "tests/cluster/cluster_test_util.h"
#include "tests/cluster/local_cluster.h"

namespace baton::testing {
namespace {

using ::testing::HasSubstr;

// Requests on a decode worker that is SIGKILLed end with UNAVAILABLE (the
// client may retry: streamed tokens cannot be taken back, so the
// coordinator does not replay them elsewhere); requests on the other decode
// worker complete; the survivors leak nothing; new requests are served.
TEST(ClusterWorkerFaultTest, DecodeWorkerKilledMidRequest) {
  LocalClusterOptions options;
  options.decode = 2;
  auto cluster = StartOrDie(options);
  ASSERT_NE(cluster, nullptr);
  constexpr int kRequests = 6;
  std::vector<StreamResult> results(kRequests);
  std::vector<std::thread> clients;
  for (int i = 0; i < kRequests; ++i) {
    clients.emplace_back([&, i] {
      results[static_cast<size_t>(i)] =
          RunGenerate(cluster->baton(), LongRequest(i, 120));
    });
  }
  // Wait until the first decode worker is generating, then kill it.
  const int victim = 1;
  ASSERT_EQ(cluster->workers()[victim].role, "decode");
  for (int i = 0; i < 500; ++i) {
    v1::GetWorkerStatusResponse status;
    grpc::ClientContext context;
    if (cluster->workers()[victim]
            .stub->GetWorkerStatus(&context, {}, &status)
            .ok() &&
        status.load().running_sequences() > 0) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  cluster->Kill(victim);
  for (std::thread& t : clients) t.join();
  int completed = 0;
  int unavailable = 0;
  for (const StreamResult& r : results) {
    if (r.status.ok() && r.has_result &&
        r.result.finish_reason() == v1::FINISH_REASON_LENGTH) {
      EXPECT_EQ(r.tokens.size(), 120u);
      ++completed;
    } else if (r.has_result) {
      EXPECT_EQ(r.result.finish_reason(), v1::FINISH_REASON_ERROR);
      EXPECT_EQ(r.result.error_code(),
                static_cast<int>(grpc::StatusCode::UNAVAILABLE))
          << r.result.error_message();
      ++unavailable;
    } else {
      EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE)
          << r.status.error_message();
      ++unavailable;
    }
  }
  EXPECT_GE(unavailable, 1);
  EXPECT_GE(completed, 1);
  ExpectAllFree(*cluster);
  // The coordinator marks it down, and serves new requests on the survivor.
  const StreamResult after = RunGenerate(cluster->baton(), LongRequest(9, 8));
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.result.decode_worker().address(),
            cluster->workers()[2].address);
  ExpectAllFree(*cluster);
  ExpectCleanStop(*cluster);
}

// A prefill worker SIGKILLed while it runs a long prompt: no token has
// reached the client, so the coordinator starts the request over on the
// other prefill worker and it completes; the decode worker's first
// reservation for it is freed; the next request (sent before the dead
// worker's lease expires) is served too.
TEST(ClusterWorkerFaultTest, PrefillWorkerKilledMidPrefill) {
  LocalClusterOptions options;
  options.prefill = 2;
  auto cluster = StartOrDie(options);
  ASSERT_NE(cluster, nullptr);
  v1::GenerateRequest request;
  // 800 prompt tokens: about half a second of prefill (a minute under
  // ThreadSanitizer).
  for (int i = 0; i < 800; ++i) {
    request.mutable_token_ids()->add_token_ids(100 + (i * 7919) % 40000);
  }
  request.mutable_sampling()->set_max_tokens(4);
  request.mutable_sampling()->set_temperature(0);
  StreamResult result;
  std::thread client([&] { result = RunGenerate(cluster->baton(), request); });
  // The prefill worker that took the prompt.
  int victim = -1;
  for (int i = 0; i < 1000 && victim < 0; ++i) {
    for (int w = 0; w < 2; ++w) {
      v1::GetWorkerStatusResponse status;
      grpc::ClientContext context;
      if (cluster->workers()[w]
              .stub->GetWorkerStatus(&context, {}, &status)
              .ok() &&
          status.leased_request_ids_size() > 0) {
        victim = w;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (victim >= 0) cluster->Kill(victim);
  client.join();
  ASSERT_GE(victim, 0) << "no prefill worker took the request: "
                       << result.status.error_message();
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(result.tokens.size(), 4u);
  EXPECT_EQ(result.result.prefill_worker().address(),
            cluster->workers()[1 - victim].address);
  ExpectAllFree(*cluster);
  const StreamResult after = RunGenerate(cluster->baton(), LongRequest(1, 4));
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.result.prefill_worker().address(),
            cluster->workers()[1 - victim].address);
  ExpectAllFree(*cluster);
  ExpectCleanStop(*cluster);
}

// The decode worker freezes (SIGSTOP) after reserving, so the prefill's
// layer-wise transfer stalls: past --transfer_timeout_ms the coordinator
// fails the request (DEADLINE_EXCEEDED, in-band: the first token was
// already streamed) and cancels it on both workers; once the decode worker
// runs again, both hold nothing.
TEST(ClusterWorkerFaultTest, StalledTransferTimesOutAndFreesBothSides) {
  LocalClusterOptions options;
  options.lease_ttl_ms = 150000;  // the frozen worker must not be declared down
  options.coordinator_flags = {"--transfer_timeout_ms=1500"};
  auto cluster = StartOrDie(options);
  ASSERT_NE(cluster, nullptr);
  LocalCluster::Worker& decode = cluster->workers()[1];
  ASSERT_EQ(decode.role, "decode");
  v1::GenerateRequest request;
  // 800 prompt tokens: 18 MB of KV, more than the sockets buffer, and about
  // half a second of prefill to freeze the decode worker in.
  for (int i = 0; i < 800; ++i) {
    request.mutable_token_ids()->add_token_ids(100 + (i * 7919) % 40000);
  }
  request.mutable_sampling()->set_max_tokens(4);
  request.mutable_sampling()->set_temperature(0);
  StreamOptions stream_options;
  stream_options.deadline = absl::Seconds(300);
  StreamResult result;
  std::thread client(
      [&] { result = RunGenerate(cluster->baton(), request, stream_options); });
  bool frozen = false;
  for (int i = 0; i < 2000 && !frozen; ++i) {
    v1::GetWorkerStatusResponse status;
    grpc::ClientContext context;
    if (decode.stub->GetWorkerStatus(&context, {}, &status).ok() &&
        status.leased_request_ids_size() > 0) {
      decode.process->Signal(SIGSTOP);
      frozen = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (frozen) {
    // Until the coordinator has given up on the transfer (minutes under
    // ThreadSanitizer, whose prefill alone takes most of one).
    for (int i = 0; i < 25000; ++i) {
      v1::GetClusterStatusResponse status;
      grpc::ClientContext context;
      if (cluster->baton().GetClusterStatus(&context, {}, &status).ok() &&
          status.active_requests() == 0) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    decode.process->Signal(SIGCONT);
  }
  client.join();
  ASSERT_TRUE(frozen) << "the decode worker never held the reservation";
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_TRUE(result.has_result);
  EXPECT_EQ(result.result.finish_reason(), v1::FINISH_REASON_ERROR);
  EXPECT_EQ(result.result.error_code(),
            static_cast<int>(grpc::StatusCode::DEADLINE_EXCEEDED))
      << result.result.error_message();
  EXPECT_THAT(result.result.error_message(), HasSubstr("transfer"));
  ExpectAllFree(*cluster);
  // The cluster still serves.
  const StreamResult after = RunGenerate(cluster->baton(), LongRequest(2, 4));
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
  ExpectAllFree(*cluster);
  ExpectCleanStop(*cluster);
}

// A device fault inside a step (--fault_after_steps, after the warm-up's
// two steps): the request in that step fails naming the fault, the worker
// turns its health service NOT_SERVING and deregisters, and the
// coordinator has no worker left for the next request.
TEST(ClusterWorkerFaultTest, DeviceFaultTakesTheWorkerOutOfService) {
  LocalClusterOptions options;
  options.prefill = 0;
  options.decode = 0;
  options.both = 1;
  options.worker_flags = {"--fault_after_steps=3"};
  auto cluster = StartOrDie(options);
  ASSERT_NE(cluster, nullptr);
  const StreamResult failed =
      RunGenerate(cluster->baton(), ChatRequest("Hi", 8, 0.0, 1));
  const std::string error = failed.status.ok() ? failed.result.error_message()
                                               : failed.status.error_message();
  EXPECT_TRUE(!failed.status.ok() ||
              failed.result.finish_reason() == v1::FINISH_REASON_ERROR);
  EXPECT_THAT(error, HasSubstr("injected device fault"));

  auto health = grpc::health::v1::Health::NewStub(grpc::CreateChannel(
      cluster->workers()[0].address, grpc::InsecureChannelCredentials()));
  bool not_serving = false;
  bool down = false;
  for (int i = 0; i < 500 && !(not_serving && down); ++i) {
    grpc::ClientContext health_context;
    grpc::health::v1::HealthCheckResponse response;
    not_serving =
        health->Check(&health_context, {}, &response).ok() &&
        response.status() == grpc::health::v1::HealthCheckResponse::NOT_SERVING;
    v1::GetClusterStatusResponse status;
    grpc::ClientContext status_context;
    down = cluster->baton().GetClusterStatus(&status_context, {}, &status).ok();
    for (const v1::WorkerStatus& w : status.workers()) {
      down = down && w.health() != v1::WORKER_HEALTH_HEALTHY;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(not_serving) << "the worker's health service still serves";
  EXPECT_TRUE(down) << "the coordinator still routes to the faulted worker";
  const StreamResult refused =
      RunGenerate(cluster->baton(), ChatRequest("Hi", 8, 0.0, 2));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << refused.status.error_message();
}

}  // namespace
}  // namespace baton::testing
