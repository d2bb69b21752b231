// Helpers of the cluster fault tests (GoogleTest assertions inside).
#ifndef BATON_TESTS_CLUSTER_CLUSTER_FAULT_UTIL_H_
#define BATON_TESTS_CLUSTER_CLUSTER_FAULT_UTIL_H_

#include <cstdint>
#include <memory>

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

}  // namespace baton::testing

#endif  // BATON_TESTS_CLUSTER_CLUSTER_FAULT_UTIL_H_
