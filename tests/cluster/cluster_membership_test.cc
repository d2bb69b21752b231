// SIGTERM drains a worker (--drain_timeout_s): its health turns NOT_SERVING
// at once, the coordinator marks it DRAINING and routes nothing new to it,
// the requests it holds finish with the tokens a run without the signal
// gives, and then it exits 0. The signal comes at a known point: the prefill
// worker stops itself in its first prefill step (fault point prefill_step)
// while the decode worker holds the request's KV reservation, so the decode
// worker's drain cannot end before the test lets the prefill go on.
//
// Coordinator replicas: workers serve several at once, each replica sees
// and sweeps only its own leases, and losing one fails only its streams.
//
// Elastic membership: under a steady load, a decode worker that joins gets
// traffic once registered, and one that leaves on SIGTERM drains first; no
// request is lost and `baton status` shows each change. A rolling restart
// of every worker of a 2P2D cluster loses nothing either.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cli/status_command.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/cluster/cluster_fault_util.h"
#include "tests/cluster/cluster_test_util.h"
#include "tests/cluster/local_cluster.h"

namespace baton::testing {
namespace {

LocalClusterOptions DrainingCluster() {
  LocalClusterOptions options;
  // The prefill worker stops itself mid-prefill; a lease longer than any
  // test keeps the coordinator from taking it for dead meanwhile.
  options.lease_ttl_ms = 3600 * 1000;
  options.flags_of_worker[0] = {"--fault=prefill_step:stop"};
  options.drain_timeout_s = 3600;
  return options;
}

// Until the prefill worker (index 0) stops itself at its fault point; on a
// failure, lets it go on and joins `client`.
void ExpectPrefillStopped(LocalCluster& cluster, std::thread& client) {
  const absl::StatusOr<int> stopped = cluster.WaitForStoppedWorker(Guard());
  if (!stopped.ok() || *stopped != 0) {
    cluster.workers()[0].process->Signal(SIGCONT);
    client.join();
  }
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  ASSERT_EQ(*stopped, 0);
}

void ExpectAnswer(const StreamResult& result, const Expected& expected) {
  ASSERT_TRUE(result.status.ok()) << Describe(result);
  ASSERT_TRUE(result.has_result) << Describe(result);
  EXPECT_EQ(result.tokens, expected.tokens);
  EXPECT_EQ(result.text, expected.text);
}

TEST(ClusterDrainTest, DecodeWorkerDrainsItsReservedRequest) {
  auto cluster = StartOrDie(DrainingCluster());
  ASSERT_NE(cluster, nullptr);
  LocalCluster::Worker& decode = cluster->workers()[1];
  ASSERT_EQ(decode.role, "decode");
  const v1::GenerateRequest request = LongRequest(0, 24);
  const std::vector<Expected> expected = InProcessReference({request});

  StreamResult result;
  std::thread client([&] { result = RunGenerate(cluster->baton(), request); });
  // The prefill worker holds the prompt; the decode worker its reservation
  // (made beside the Prefill, so it may come after the prefill's stop).
  ASSERT_NO_FATAL_FAILURE(ExpectPrefillStopped(*cluster, client));
  const absl::Status reserved = cluster->WaitForLeases(1, 1, Guard());
  EXPECT_TRUE(reserved.ok()) << reserved;

  decode.process->Signal(SIGTERM);
  EXPECT_TRUE(Eventually([&] {
    return OwnHealth(decode.address) ==
           grpc::health::v1::HealthCheckResponse::NOT_SERVING;
  })) << "the draining worker's health stayed SERVING";
  EXPECT_TRUE(Eventually([&] {
    return HealthAtCoordinator(*cluster, decode.address) ==
           v1::WORKER_HEALTH_DRAINING;
  })) << "the coordinator did not mark the worker DRAINING";
  // The reservation still holds it: no exit while its request is in flight.
  EXPECT_TRUE(decode.process->running());

  cluster->workers()[0].process->Signal(SIGCONT);
  client.join();
  ExpectAnswer(result, expected[0]);
  EXPECT_EQ(result.result.decode_worker().address(), decode.address);
  ExpectExitsZero(decode);
  // Removed once it deregistered after the drain.
  EXPECT_TRUE(Eventually([&] {
    const v1::WorkerHealth h = HealthAtCoordinator(*cluster, decode.address);
    return h != v1::WORKER_HEALTH_DRAINING && h != v1::WORKER_HEALTH_HEALTHY;
  }));
  ExpectCleanStop(*cluster);
}

TEST(ClusterDrainTest, PrefillWorkerFinishesItsPrefillBeforeExiting) {
  auto cluster = StartOrDie(DrainingCluster());
  ASSERT_NE(cluster, nullptr);
  LocalCluster::Worker& prefill = cluster->workers()[0];
  const v1::GenerateRequest request = LongRequest(1, 16);
  const std::vector<Expected> expected = InProcessReference({request});

  StreamResult result;
  std::thread client([&] { result = RunGenerate(cluster->baton(), request); });
  // The prefill worker holds the prompt; the decode worker its reservation
  // (made beside the Prefill, so it may come after the prefill's stop).
  ASSERT_NO_FATAL_FAILURE(ExpectPrefillStopped(*cluster, client));
  const absl::Status reserved = cluster->WaitForLeases(1, 1, Guard());
  EXPECT_TRUE(reserved.ok()) << reserved;
  // Signalled mid-prefill: the prefill, its handoff and the request finish.
  prefill.process->Signal(SIGTERM);
  prefill.process->Signal(SIGCONT);
  client.join();
  ExpectAnswer(result, expected[0]);
  ExpectExitsZero(prefill);
  ExpectAllFree(*cluster);
  ExpectCleanStop(*cluster);
}

// `baton status --json`: health by worker address ("healthy", "draining",
// ...); a worker the coordinator no longer lists is absent.
std::map<std::string, std::string> StatusCommandHealth(LocalCluster& cluster) {
  cli::StatusOptions options;
  options.server = cluster.address();
  options.json = true;
  std::ostringstream out;
  std::map<std::string, std::string> health;
  if (!cli::RunStatus(options, out).ok()) return health;
  const nlohmann::json status =
      nlohmann::json::parse(out.str(), nullptr,
                            /*allow_exceptions=*/false);
  if (!status.is_object() || !status.contains("workers")) return health;
  for (const nlohmann::json& w : status["workers"]) {
    health[w.value("address", "")] = w.value("health", "");
  }
  return health;
}

// Clients that send requests back to back until stopped, cycling through
// `requests`; client c starts at coordinator replica c % replicas and, when
// a replica answers UNAVAILABLE, sends the same request to the next one (as
// a client of several replicas retries). Every answer is kept, so none can
// go missing.
class SteadyLoad {
 public:
  SteadyLoad(LocalCluster& cluster, std::vector<v1::GenerateRequest> requests,
             int clients, int replicas = 1)
      : requests_(std::move(requests)) {
    for (int c = 0; c < clients; ++c) {
      threads_.emplace_back([this, &cluster, c, clients, replicas] {
        int replica = c % replicas;
        for (size_t i = static_cast<size_t>(c); !stop_.load();
             i += static_cast<size_t>(clients)) {
          Answer answer;
          answer.which = i % requests_.size();
          answer.sent = absl::Now();
          while (true) {
            answer.replica = replica;
            answer.result =
                RunGenerate(cluster.baton(replica), requests_[answer.which]);
            if (answer.result.status.error_code() !=
                    grpc::StatusCode::UNAVAILABLE ||
                answer.retries >= 2 * replicas) {
              break;
            }
            ++answer.retries;
            replica = (replica + 1) % replicas;
          }
          absl::MutexLock lock(&mu_);
          answers_.push_back(std::move(answer));
        }
      });
    }
  }
  ~SteadyLoad() { Stop(); }

  void Stop() {
    stop_.store(true);
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }
  size_t answered() {
    absl::MutexLock lock(&mu_);
    return answers_.size();
  }
  // Answers coordinator replica `replica` gave to requests sent after
  // `since`.
  int AnsweredBy(int replica, absl::Time since = absl::InfinitePast()) {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const Answer& a : answers_) {
      if (a.sent > since && a.replica == replica) ++n;
    }
    return n;
  }
  // Answers to requests sent after `since` that came through the decode
  // worker at `address`.
  int DecodedBy(const std::string& address,
                absl::Time since = absl::InfinitePast()) {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const Answer& a : answers_) {
      if (a.sent > since &&
          a.result.result.decode_worker().address() == address) {
        ++n;
      }
    }
    return n;
  }
  int retries() {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const Answer& a : answers_) n += a.retries;
    return n;
  }
  // Every answer is complete and bit-identical to `expected`.
  void ExpectAllAnswered(const std::vector<Expected>& expected) {
    absl::MutexLock lock(&mu_);
    for (const Answer& a : answers_) {
      ASSERT_TRUE(a.result.status.ok())
          << Describe(a.result) << " (replica " << a.replica << ", after "
          << a.retries << " retries)";
      ASSERT_TRUE(a.result.has_result) << Describe(a.result);
      EXPECT_EQ(a.result.tokens, expected[a.which].tokens)
          << "request " << a.which;
      EXPECT_EQ(a.result.text, expected[a.which].text) << "request " << a.which;
    }
  }

 private:
  struct Answer {
    size_t which = 0;  // index in requests_
    absl::Time sent;
    int replica = 0;  // that answered
    int retries = 0;  // UNAVAILABLE answers before it
    StreamResult result;
  };
  const std::vector<v1::GenerateRequest> requests_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  std::vector<Answer> answers_ ABSL_GUARDED_BY(mu_);
};

TEST(ClusterElasticTest, DecodeWorkerJoinsAndAnotherLeavesUnderLoad) {
  LocalClusterOptions options;
  options.drain_timeout_s = 3600;  // the leaving worker exits once empty
  auto cluster = StartOrDie(options);
  ASSERT_NE(cluster, nullptr);
  const std::string first = cluster->workers()[1].address;
  ASSERT_EQ(cluster->workers()[1].role, "decode");
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < 4; ++i) requests.push_back(LongRequest(10 + i, 12));
  const std::vector<Expected> expected = InProcessReference(requests);

  SteadyLoad load(*cluster, requests, /*clients=*/2);
  ASSERT_TRUE(Eventually([&] { return load.answered() >= 2; }));

  // Joins: registered, listed, and routed to.
  const absl::StatusOr<int> added = cluster->AddWorker("decode");
  ASSERT_TRUE(added.ok()) << added.status();
  const std::string second = cluster->workers()[*added].address;
  const absl::Status healthy = cluster->WaitHealthy(3, Guard());
  ASSERT_TRUE(healthy.ok()) << healthy;
  EXPECT_EQ(StatusCommandHealth(*cluster)[second], "healthy");
  EXPECT_TRUE(Eventually([&] { return load.DecodedBy(second) > 0; }))
      << "the new decode worker got no request";

  // Leaves: drained, gone from the status, and nothing lost meanwhile.
  cluster->workers()[1].process->Signal(SIGTERM);
  ExpectExitsZero(cluster->workers()[1]);
  const absl::Time left = absl::Now();
  EXPECT_TRUE(Eventually([&] {
    return StatusCommandHealth(*cluster).count(first) == 0;
  })) << "baton status still lists the worker that left";
  const size_t after_leave = load.answered();
  EXPECT_TRUE(Eventually([&] { return load.answered() >= after_leave + 2; }));
  load.Stop();
  EXPECT_EQ(load.DecodedBy(first, left), 0);
  load.ExpectAllAnswered(expected);
  ExpectAllFree(*cluster);
  ExpectCleanStop(*cluster);
}

// A rolling restart of a 2P2D cluster under a steady load: every worker in
// turn gets SIGTERM, drains (its requests finish, nothing new comes to it),
// exits 0 and is replaced by a new process of its role, which registers and
// takes traffic before the next one goes. No request fails or is retried,
// and every answer is bit-identical to the in-process engine's. The load is
// two clients sending back to back: at most two requests in flight, where
// the cluster batches many more.
TEST(ClusterElasticTest, RollingRestartOfEveryWorkerLosesNothing) {
  LocalClusterOptions options;
  options.prefill = 2;
  options.decode = 2;
  options.drain_timeout_s = 3600;  // each leaving worker exits once empty
  auto cluster = StartOrDie(options);
  ASSERT_NE(cluster, nullptr);
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < 4; ++i) {
    requests.push_back(LongRequest(30 + i, 12));
    if (i % 2 == 0) requests.back().mutable_sampling()->set_temperature(0);
  }
  const std::vector<Expected> expected = InProcessReference(requests);

  SteadyLoad load(*cluster, requests, /*clients=*/2);
  ASSERT_TRUE(Eventually([&] { return load.answered() >= 2; }));
  for (int i = 0; i < 4; ++i) {
    LocalCluster::Worker& leaving = cluster->workers()[i];
    const std::string role = leaving.role;
    SCOPED_TRACE(absl::StrCat("restarting worker ", i, " (", role, ")"));
    leaving.process->Signal(SIGTERM);
    ExpectExitsZero(leaving);
    const absl::StatusOr<int> added = cluster->AddWorker(role);
    ASSERT_TRUE(added.ok()) << added.status();
    const absl::Status healthy = cluster->WaitHealthy(4, Guard());
    ASSERT_TRUE(healthy.ok()) << healthy;
    const std::string address = cluster->workers()[*added].address;
    const size_t before = load.answered();
    if (role == "decode") {
      EXPECT_TRUE(Eventually([&] { return load.DecodedBy(address) > 0; }))
          << "the new decode worker got no request";
    }
    EXPECT_TRUE(Eventually([&] { return load.answered() >= before + 2; }));
  }
  load.Stop();
  load.ExpectAllAnswered(expected);
  EXPECT_EQ(load.retries(), 0) << "a request was refused during the restart";
  std::printf("rolling restart: %zu answers, 4 workers replaced\n",
              load.answered());
  ExpectAllFree(*cluster);
  ExpectCleanStop(*cluster);
}

// A decode KV pool that holds one of the replica test's requests and not
// two (the default model's f16 KV: 30 layers x 3 heads x 64 x 2 x 2 bytes,
// 23 KiB a token, so 2 MiB is 5 blocks of 16 tokens; a request, 51
// tokens, needs 4: 62 reservations were refused in one run).
constexpr int64_t kOneRequestMib = 2;

// Active requests at coordinator replica `r` (-1 if it does not answer).
int ActiveAt(LocalCluster& cluster, int r) {
  v1::GetClusterStatusResponse status;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  if (!cluster.baton(r).GetClusterStatus(&context, {}, &status).ok()) return -1;
  return status.active_requests();
}

// Three coordinator replicas serve one 1P2D cluster; every worker registers
// with each. The decode pools hold one request each, so the replicas race
// for them and the workers' refusals keep the reservations right. Killing
// one replica mid-load fails only the streams it carried, with a retriable
// status (the clients retry on another replica); the others keep serving,
// every answer is the one a fault-free run gives, and no block leaks.
TEST(ClusterReplicaTest, KillingOneReplicaFailsOnlyItsStreams) {
  LocalClusterOptions options;
  options.coordinators = 3;
  options.decode = 2;
  options.decode_kv_cache_mib = kOneRequestMib;
  auto cluster = StartOrDie(options);
  ASSERT_NE(cluster, nullptr);
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < 6; ++i) requests.push_back(LongRequest(20 + i, 12));
  const std::vector<Expected> expected = InProcessReference(requests);

  SteadyLoad load(*cluster, requests, /*clients=*/3, /*replicas=*/3);
  ASSERT_TRUE(Eventually([&] {
    return load.AnsweredBy(0) > 0 && load.AnsweredBy(1) > 0 &&
           load.AnsweredBy(2) > 0;
  })) << "not every replica answered";
  // Killed while it carries a request.
  ASSERT_TRUE(Eventually([&] { return ActiveAt(*cluster, 0) > 0; }));
  cluster->KillCoordinator(0);
  const absl::Time killed = absl::Now();
  EXPECT_TRUE(Eventually([&] {
    return load.AnsweredBy(1, killed) >= 2 && load.AnsweredBy(2, killed) >= 2;
  })) << "the other replicas stopped serving";
  load.Stop();
  EXPECT_EQ(load.AnsweredBy(0, killed), 0);
  load.ExpectAllAnswered(expected);
  std::printf("replicas: %zu answers, %d retried on another replica\n",
              load.answered(), load.retries());
  ExpectAllFree(*cluster);
  ExpectCleanStop(*cluster);
}

}  // namespace
}  // namespace baton::testing
