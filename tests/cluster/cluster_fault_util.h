// Helpers of the cluster fault tests (GoogleTest assertions inside).
#ifndef BATON_TESTS_CLUSTER_CLUSTER_FAULT_UTIL_H_
#define BATON_TESTS_CLUSTER_CLUSTER_FAULT_UTIL_H_

#include <grpcpp/grpcpp.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/cluster/cluster_test_util.h"
#include "tests/cluster/local_cluster.h"

namespace baton::testing {

// A sampled chat request that generates exactly max_tokens tokens.
inline v1::GenerateRequest LongRequest(int i, int max_tokens) {
  v1::GenerateRequest request = ChatRequest(
      absl::StrCat("Tell a long story number ", i, "."), max_tokens, 0.7,
      /*seed=*/77 + static_cast<uint64_t>(i));
  request.mutable_sampling()->set_ignore_eos(true);
  return request;
}

// n LongRequests of max_tokens each, greedy (even i) and seeded (odd i).
inline std::vector<v1::GenerateRequest> MixedLongRequests(int n,
                                                          int max_tokens) {
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < n; ++i) {
    requests.push_back(LongRequest(i, max_tokens));
    if (i % 2 == 0) requests.back().mutable_sampling()->set_temperature(0);
  }
  return requests;
}

// A guard against a hang, never a bound the test measures.
inline absl::Duration Guard() { return absl::Seconds(120) + 100 * HostPace(); }

// Polls `done` every 10 ms until it holds or Guard() runs out.
template <typename F>
bool Eventually(F done) {
  const absl::Time deadline = absl::Now() + Guard();
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

// The serving status a process's own health service reports for the whole
// server (UNKNOWN if it does not answer).
inline grpc::health::v1::HealthCheckResponse::ServingStatus OwnHealth(
    const std::string& address) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  grpc::health::v1::HealthCheckResponse response;
  if (!stub->Check(&context, {}, &response).ok()) {
    return grpc::health::v1::HealthCheckResponse::UNKNOWN;
  }
  return response.status();
}

// `process` exits with status 0 (within Guard()).
inline void ExpectExitsZero(ChildProcess& process) {
  const absl::StatusOr<int> status = process.Wait(Guard());
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << "wait status " << *status;
}
inline void ExpectExitsZero(LocalCluster::Worker& worker) {
  ExpectExitsZero(*worker.process);
}

inline std::unique_ptr<LocalCluster> StartOrDie(
    const LocalClusterOptions& options) {
  auto cluster = LocalCluster::Start(options);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? std::move(*cluster) : nullptr;
}

inline void ExpectAllFree(LocalCluster& cluster) {
  const absl::Status free = cluster.WaitAllFree(absl::Seconds(10));
  EXPECT_TRUE(free.ok()) << free;
}

// Every process still running stops cleanly on SIGTERM.
inline void ExpectCleanStop(LocalCluster& cluster) {
  const absl::Status stopped = cluster.Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

// Client streams of `requests`, one thread each, under way while a test
// injects its fault. The constructor returns once every stream holds at
// least `min_tokens` tokens (or ended); with `staggered`, each stream
// starts only once the previous one got there. Join() waits for the ends;
// results() are final after it.
class StreamsUnderway {
 public:
  StreamsUnderway(v1::Baton::Stub& stub,
                  std::vector<v1::GenerateRequest> requests, size_t min_tokens,
                  bool staggered)
      : requests_(std::move(requests)),
        results_(requests_.size()),
        ready_(requests_.size()) {
    for (size_t i = 0; i < requests_.size(); ++i) {
      threads_.emplace_back([this, &stub, i, min_tokens] {
        StreamOptions stream;
        stream.on_message = [this, i, min_tokens](const StreamResult& so_far) {
          if (so_far.tokens.size() >= min_tokens &&
              !ready_[i].HasBeenNotified()) {
            ready_[i].Notify();
          }
        };
        results_[i] = RunGenerate(stub, requests_[i], stream);
        if (!ready_[i].HasBeenNotified()) ready_[i].Notify();  // ended early
      });
      if (staggered) ready_[i].WaitForNotification();
    }
    for (absl::Notification& n : ready_) n.WaitForNotification();
  }
  ~StreamsUnderway() { Join(); }

  void Join() {
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  const std::vector<StreamResult>& results() const { return results_; }

 private:
  std::vector<v1::GenerateRequest> requests_;
  std::vector<StreamResult> results_;
  std::vector<absl::Notification> ready_;
  std::vector<std::thread> threads_;
};

// Runs `requests` at once, one client thread each; their results in order.
inline std::vector<StreamResult> RunConcurrently(
    v1::Baton::Stub& stub, const std::vector<v1::GenerateRequest>& requests) {
  std::vector<StreamResult> results(requests.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back(
        [&, i] { results[i] = RunGenerate(stub, requests[i]); });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

// Every request completed with all its max_tokens tokens after migrating
// once, and ended on the decode worker at `address`.
inline void ExpectMigratedOnceTo(const std::vector<StreamResult>& results,
                                 int max_tokens, const std::string& address) {
  for (size_t i = 0; i < results.size(); ++i) {
    const StreamResult& r = results[i];
    ASSERT_TRUE(r.status.ok() && r.has_result) << i << ": " << Describe(r);
    EXPECT_EQ(r.result.finish_reason(), v1::FINISH_REASON_LENGTH)
        << i << ": " << Describe(r);
    EXPECT_EQ(r.tokens.size(), static_cast<size_t>(max_tokens)) << i;
    EXPECT_EQ(r.result.migrations(), 1) << i;
    EXPECT_EQ(r.result.decode_worker().address(), address) << i;
  }
}

// Each moved request's whole output (tokens and text) equals its fault-free
// run's, which did not migrate.
inline void ExpectSameOutputs(const std::vector<StreamResult>& moved,
                              const std::vector<StreamResult>& fault_free) {
  ASSERT_EQ(moved.size(), fault_free.size());
  for (size_t i = 0; i < moved.size(); ++i) {
    ASSERT_TRUE(fault_free[i].status.ok() && fault_free[i].has_result)
        << Describe(fault_free[i]);
    EXPECT_EQ(fault_free[i].result.migrations(), 0);
    EXPECT_EQ(moved[i].tokens, fault_free[i].tokens) << "request " << i;
    EXPECT_EQ(moved[i].text, fault_free[i].text) << "request " << i;
  }
}

// The worker's health as the coordinator's GetClusterStatus shows it;
// UNSPECIFIED if the call fails or no worker has this address.
inline v1::WorkerHealth HealthAtCoordinator(LocalCluster& cluster,
                                            const std::string& address) {
  v1::GetClusterStatusResponse status;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  if (!cluster.baton().GetClusterStatus(&context, {}, &status).ok()) {
    return v1::WORKER_HEALTH_UNSPECIFIED;
  }
  for (const v1::WorkerStatus& w : status.workers()) {
    if (w.worker().address() == address) return w.health();
  }
  return v1::WORKER_HEALTH_UNSPECIFIED;
}

}  // namespace baton::testing

#endif  // BATON_TESTS_CLUSTER_CLUSTER_FAULT_UTIL_H_
