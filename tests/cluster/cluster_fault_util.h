// Helpers of the cluster fault tests (GoogleTest assertions inside).
#ifndef BATON_TESTS_CLUSTER_CLUSTER_FAULT_UTIL_H_
#define BATON_TESTS_CLUSTER_CLUSTER_FAULT_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
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
