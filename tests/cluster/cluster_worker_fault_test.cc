// Real clusters on loopback whose workers die (SIGKILL) or freeze (SIGSTOP)
// mid-request. After each, every surviving worker must report
// kv_blocks_free == kv_blocks_total and no leased request.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/cluster/cluster_fault_util.h"
#include "tests/cluster/cluster_test_util.h"
#include "tests/cluster/local_cluster.h"

namespace baton::testing {
namespace {

using ::testing::HasSubstr;

// Requests on a decode worker that fails mid-stream migrate: the
// coordinator prefills each again and hands its KV to another decode
// worker, which continues from the tokens the client already has. Every
// request completes, and its whole output (tokens and text) is the one a
// fault-free run gives, greedy and seeded sampling alike; the survivors
// leak nothing. The fault comes at a known point: every request has
// streamed at least two tokens from the victim, the only decode worker
// then; a second decode worker joins just before it.
// Colocated, the same holds with `both` workers: the new worker prefills
// and generates the request again and streams from the first token the
// client lacks.
enum class DecodeFault { kKill, kFreeze };

void ExpectMigratedWithIdenticalOutput(DecodeFault fault,
                                       bool colocated = false) {
  LocalClusterOptions options;
  if (colocated) {
    options.prefill = 0;
    options.decode = 0;
    options.both = 1;
  }
  const std::string role = colocated ? "both" : "decode";
  const int victim = colocated ? 0 : 1;
  auto cluster = StartOrDie(options);
  ASSERT_NE(cluster, nullptr);
  ASSERT_EQ(cluster->workers()[victim].role, role);
  constexpr int kRequests = 4;
  constexpr int kTokens = 120;
  const std::vector<v1::GenerateRequest> requests =
      MixedLongRequests(kRequests, kTokens);
  StreamsUnderway streams(cluster->baton(), requests, /*min_tokens=*/2,
                          /*staggered=*/true);
  const absl::StatusOr<int> joined = cluster->AddWorker(role);
  EXPECT_TRUE(joined.ok()) << joined.status();
  if (joined.ok()) {
    const absl::Status healthy =
        cluster->WaitHealthy(colocated ? 2 : 3, absl::Seconds(120));
    EXPECT_TRUE(healthy.ok()) << healthy;
  }
  if (fault == DecodeFault::kKill) {
    cluster->Kill(victim);
  } else {
    cluster->workers()[victim].process->Signal(SIGSTOP);
  }
  streams.Join();
  if (fault == DecodeFault::kFreeze) {
    // Back, it finds itself dropped, frees what it held and registers again.
    cluster->workers()[victim].process->Signal(SIGCONT);
  }
  ASSERT_TRUE(joined.ok());
  const std::vector<StreamResult>& results = streams.results();
  ExpectMigratedOnceTo(results, kTokens, cluster->workers()[*joined].address);
  ExpectAllFree(*cluster);
  // The fault-free run of each request, on the new decode worker.
  ExpectSameOutputs(results, RunConcurrently(cluster->baton(), requests));
  ExpectAllFree(*cluster);
  ExpectCleanStop(*cluster);
}

// SIGKILL: the Decode streams break at once.
TEST(ClusterWorkerFaultTest, DecodeWorkerKilledMidRequestMigrates) {
  ExpectMigratedWithIdenticalOutput(DecodeFault::kKill);
}

// SIGSTOP: the streams stay open but quiet; the worker's lease expires, the
// coordinator marks it DOWN (a typed abort of that attempt only) and the
// requests move on; once continued, the frozen worker frees what it held.
TEST(ClusterWorkerFaultTest, DecodeWorkerFrozenMidRequestMigrates) {
  ExpectMigratedWithIdenticalOutput(DecodeFault::kFreeze);
}

// A colocated worker SIGKILLed mid-stream: its requests move to the other
// `both` worker.
TEST(ClusterWorkerFaultTest, ColocatedWorkerKilledMidRequestMigrates) {
  ExpectMigratedWithIdenticalOutput(DecodeFault::kKill, /*colocated=*/true);
}

// The same fault with migration off (--max_migrations=0): the victim's
// requests end with UNAVAILABLE (retriable; streamed tokens cannot be taken
// back), the others complete.
TEST(ClusterWorkerFaultTest, DecodeWorkerKilledWithoutMigrationIsUnavailable) {
  LocalClusterOptions options;
  options.decode = 2;
  const int victim = 1;
  options.flags_of_worker[victim] = {"--fault=decode_step:stop@5"};
  options.coordinator_flags = {"--max_migrations=0"};
  auto cluster = StartOrDie(options);
  ASSERT_NE(cluster, nullptr);
  constexpr int kRequests = 4;
  std::vector<StreamResult> results(kRequests);
  std::vector<std::thread> clients;
  for (int i = 0; i < kRequests; ++i) {
    clients.emplace_back([&, i] {
      results[static_cast<size_t>(i)] =
          RunGenerate(cluster->baton(), LongRequest(i, 60));
    });
  }
  const absl::StatusOr<int> stopped =
      cluster->WaitForStoppedWorker(absl::Seconds(120));
  EXPECT_TRUE(stopped.ok()) << stopped.status();
  if (stopped.ok()) cluster->Kill(*stopped);
  for (std::thread& t : clients) t.join();
  int completed = 0;
  int unavailable = 0;
  for (const StreamResult& r : results) {
    if (r.status.ok() && r.has_result &&
        r.result.finish_reason() == v1::FINISH_REASON_LENGTH) {
      EXPECT_EQ(r.tokens.size(), 60u);
      ++completed;
    } else {
      const grpc::StatusCode code =
          r.has_result ? static_cast<grpc::StatusCode>(r.result.error_code())
                       : r.status.error_code();
      EXPECT_EQ(code, grpc::StatusCode::UNAVAILABLE) << Describe(r);
      ++unavailable;
    }
  }
  EXPECT_GE(unavailable, 1);
  EXPECT_GE(completed, 1);
  ExpectAllFree(*cluster);
  ExpectCleanStop(*cluster);
}

// A prefill worker SIGKILLed mid-prefill, at a known point: its first
// prompt step (fault point prefill_step), before the model ran. The request
// is leased there, the decode worker holds its reservation, and no token
// exists yet, so the coordinator starts the request over on the other
// prefill worker and it completes; the decode worker's first reservation
// for it is freed; the next request (sent before the dead worker's lease
// expires) is served too. Both prefill workers stop at that point: the
// first is killed there, the second (the retry) is continued.
TEST(ClusterWorkerFaultTest, PrefillWorkerKilledMidPrefill) {
  LocalClusterOptions options;
  options.prefill = 2;
  options.worker_flags = {"--fault=prefill_step:stop"};
  auto cluster = StartOrDie(options);
  ASSERT_NE(cluster, nullptr);
  ASSERT_EQ(cluster->workers()[2].role, "decode");
  v1::GenerateRequest request;
  // Several KV blocks; the length does not matter for the fault's timing.
  for (int i = 0; i < 100; ++i) {
    request.mutable_token_ids()->add_token_ids(100 + (i * 7919) % 40000);
  }
  request.mutable_sampling()->set_max_tokens(4);
  request.mutable_sampling()->set_temperature(0);
  request.mutable_sampling()->set_ignore_eos(true);
  StreamResult result;
  std::thread client([&] { result = RunGenerate(cluster->baton(), request); });
  const absl::StatusOr<int> victim =
      cluster->WaitForStoppedWorker(absl::Seconds(120));
  if (victim.ok()) cluster->Kill(*victim);
  const absl::StatusOr<int> retried =
      victim.ok() ? cluster->WaitForStoppedWorker(absl::Seconds(120))
                  : victim.status();
  if (retried.ok()) cluster->workers()[*retried].process->Signal(SIGCONT);
  client.join();
  ASSERT_TRUE(victim.ok()) << victim.status() << "; " << Describe(result);
  ASSERT_TRUE(retried.ok()) << retried.status() << "; " << Describe(result);
  EXPECT_EQ(*retried, 1 - *victim);
  ASSERT_TRUE(result.status.ok()) << Describe(result);
  ASSERT_TRUE(result.has_result) << Describe(result);
  EXPECT_EQ(result.result.finish_reason(), v1::FINISH_REASON_LENGTH)
      << Describe(result);
  EXPECT_EQ(result.tokens.size(), 4u) << Describe(result);
  EXPECT_EQ(result.result.retries(), 1) << Describe(result);
  EXPECT_EQ(result.result.migrations(), 0) << Describe(result);
  EXPECT_EQ(result.result.prefill_worker().address(),
            cluster->workers()[*retried].address);
  ExpectAllFree(*cluster);
  const StreamResult after = RunGenerate(cluster->baton(), LongRequest(1, 4));
  EXPECT_TRUE(after.status.ok()) << Describe(after);
  EXPECT_EQ(after.result.prefill_worker().address(),
            cluster->workers()[*retried].address);
  ExpectAllFree(*cluster);
  ExpectCleanStop(*cluster);
}

// The decode worker freezes (SIGSTOP) after reserving, so the prefill's
// layer-wise transfer stalls: past --transfer_timeout_ms the coordinator
// fails the request (DEADLINE_EXCEEDED, in-band: the first token was
// already streamed) and cancels it on both workers; once the decode worker
// runs again, both hold nothing. The freeze comes at a known point: the
// prefill worker stops itself at its first prompt step (fault point
// prefill_step), the decode worker's reservation (made beside the Prefill)
// is awaited, the decode worker is frozen, then the prefill worker
// continued. The KV connection's own no-progress timeout
// (--kv_stall_timeout_ms) is set past the test's deadline: the prefill
// sender waits on the frozen receiver from its first layer on, and on a
// slow host the prefill outlasts the default 10 s, which would fail the
// request on the prefill worker before the coordinator's timer starts.
TEST(ClusterWorkerFaultTest, StalledTransferTimesOutAndFreesBothSides) {
  LocalClusterOptions options;
  // The frozen worker must not be declared down, however long the prefill
  // before the transfer takes on this host.
  options.lease_ttl_ms = 3600000;
  options.coordinator_flags = {"--transfer_timeout_ms=1500"};
  options.worker_flags = {
      "--fault=prefill_step:stop",
      absl::StrCat("--kv_stall_timeout_ms=",
                   absl::ToInt64Milliseconds(2 * DefaultTestDeadline()))};
  auto cluster = StartOrDie(options);
  ASSERT_NE(cluster, nullptr);
  LocalCluster::Worker& decode = cluster->workers()[1];
  ASSERT_EQ(decode.role, "decode");
  v1::GenerateRequest request;
  // 800 prompt tokens: 18 MB of KV, more than the sockets buffer.
  for (int i = 0; i < 800; ++i) {
    request.mutable_token_ids()->add_token_ids(100 + (i * 7919) % 40000);
  }
  request.mutable_sampling()->set_max_tokens(4);
  request.mutable_sampling()->set_temperature(0);
  StreamOptions stream_options;
  stream_options.deadline = absl::InfiniteDuration();  // ctest's timeout
  StreamResult result;
  std::thread client(
      [&] { result = RunGenerate(cluster->baton(), request, stream_options); });
  const absl::StatusOr<int> stopped =
      cluster->WaitForStoppedWorker(absl::Seconds(120));
  const bool frozen = stopped.ok() && *stopped == 0;
  if (frozen) {
    const absl::Status reserved =
        cluster->WaitForLeases(1, 1, DefaultTestDeadline());
    EXPECT_TRUE(reserved.ok()) << reserved;
    decode.process->Signal(SIGSTOP);
    cluster->workers()[0].process->Signal(SIGCONT);
    // Until the coordinator has given up on the transfer (minutes under
    // ThreadSanitizer, whose prefill alone takes most of one).
    const absl::Time give_up = absl::Now() + DefaultTestDeadline();
    while (absl::Now() < give_up) {
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
  ASSERT_TRUE(frozen) << "the prefill worker did not stop at prefill_step: "
                      << stopped.status() << "; " << Describe(result);
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

// A worker stopped (SIGTERM) while a request runs on it ends the request's
// streams and exits cleanly: every Prefill and Decode stream reactor is
// finished and freed (under ASan, LeakSanitizer's exit check finds
// nothing; a leak makes the exit status non-zero, which StopWorker
// reports). The stop comes at a known point: the prefill worker mid-prefill
// (its first prompt step), the decode worker mid-decode (its 3rd decode
// step, the sequence joined to its batch).
TEST(ClusterWorkerFaultTest, WorkerStoppedMidRequestFinishesItsStreams) {
  for (const bool prefill_side : {true, false}) {
    SCOPED_TRACE(prefill_side ? "prefill worker" : "decode worker");
    LocalClusterOptions options;
    const int index = prefill_side ? 0 : 1;
    options.flags_of_worker[index] = {prefill_side
                                          ? "--fault=prefill_step:stop"
                                          : "--fault=decode_step:stop@3"};
    auto cluster = StartOrDie(options);
    ASSERT_NE(cluster, nullptr);
    StreamResult result;
    std::thread client(
        [&] { result = RunGenerate(cluster->baton(), LongRequest(3, 64)); });
    const absl::StatusOr<int> stopped =
        cluster->WaitForStoppedWorker(absl::Seconds(120));
    EXPECT_TRUE(stopped.ok()) << stopped.status();
    if (stopped.ok()) {
      EXPECT_EQ(*stopped, index);
      const absl::Status exited = cluster->StopWorker(*stopped);
      EXPECT_TRUE(exited.ok()) << exited;
    }
    client.join();
    // The request ends (it cannot complete without the worker), with the
    // error of a worker that is gone.
    const grpc::StatusCode code =
        result.status.ok() && result.has_result
            ? static_cast<grpc::StatusCode>(result.result.error_code())
            : result.status.error_code();
    EXPECT_EQ(code, grpc::StatusCode::UNAVAILABLE) << Describe(result);
    ExpectCleanStop(*cluster);
  }
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
