// Real clusters on loopback (a baton-coordinator and worker processes):
// every shape returns token for token what one in-process engine returns for
// the same requests and seeds, greedy and sampled, with 32 concurrent
// streams; afterwards every worker has all its KV blocks free.
#include <grpcpp/grpcpp.h>

#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster/cluster_test_util.h"
#include "tests/cluster/local_cluster.h"

namespace baton::testing {
namespace {

constexpr int kStreams = 32;

struct Shape {
  const char* name;
  int prefill;
  int decode;
  int both;
  // The coordinator's --overlap_reserve_kv=false: the decode worker's
  // reservation made before the Prefill is sent (the default makes it
  // beside the Prefill).
  bool reserve_first = false;
};

constexpr Shape kShapes[] = {
    {"1P1D", 1, 1, 0},
    {"2P1D", 2, 1, 0},
    {"1P2D", 1, 2, 0},
    {"2C", 0, 0, 2},
    {"1P2D, reserved before the prefill", 1, 2, 0, true}};

// One process for every shape: the in-process reference (the expensive part
// under the sanitizers) is computed once.
class ClusterEquivalenceTest : public ::testing::Test {
 protected:
  // Half greedy, half sampled, different prompts and lengths.
  static std::vector<v1::GenerateRequest> Requests() {
    const char* topics[] = {"the sea",   "a robot",  "autumn",   "coffee",
                            "mountains", "a violin", "the moon", "trains"};
    std::vector<v1::GenerateRequest> requests;
    for (int i = 0; i < kStreams; ++i) {
      const bool greedy = i % 2 == 0;
      requests.push_back(ChatRequest(
          absl::StrCat("Write one sentence about ", topics[i % 8], "."),
          /*max_tokens=*/6 + i % 7, greedy ? 0.0 : 0.8,
          /*seed=*/1000 + static_cast<uint64_t>(i)));
      requests.back().set_request_id(absl::StrCat("eq-", i));
    }
    return requests;
  }

  static std::vector<Expected>* expected_;
  // The in-process engine's time for the whole batch, on this host.
  static absl::Duration reference_took_;
  static void SetUpTestSuite() {
    expected_ = new std::vector<Expected>(
        InProcessReference(Requests(), &reference_took_));
  }
  static void TearDownTestSuite() { delete expected_; }
  static void CheckShape(const Shape& shape);
};

std::vector<Expected>* ClusterEquivalenceTest::expected_ = nullptr;
absl::Duration ClusterEquivalenceTest::reference_took_;

void ClusterEquivalenceTest::CheckShape(const Shape& shape) {
  LocalClusterOptions options;
  options.prefill = shape.prefill;
  options.decode = shape.decode;
  options.both = shape.both;
  if (shape.reserve_first) {
    options.coordinator_flags = {"--overlap_reserve_kv=false"};
  }
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  const std::vector<v1::GenerateRequest> requests = Requests();
  std::vector<StreamResult> results(requests.size());
  std::vector<std::thread> clients;
  // The cluster does the reference's work on one thread per worker (the
  // reference used two), streams by RPC and hands KV over; far more than
  // that is a hang.
  StreamOptions stream_options;
  stream_options.deadline = DefaultTestDeadline() + 20 * reference_took_;
  for (size_t i = 0; i < requests.size(); ++i) {
    clients.emplace_back([&, i] {
      results[i] =
          RunGenerate((*cluster)->baton(), requests[i], stream_options);
    });
  }
  for (std::thread& t : clients) t.join();

  std::set<std::string> prefill_workers;
  std::set<std::string> decode_workers;
  int reserved_beside = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE(absl::StrCat(shape.name, " request ", i));
    const StreamResult& r = results[i];
    ASSERT_TRUE(r.status.ok())
        << Describe(r) << " (deadline " << stream_options.deadline << ")";
    ASSERT_TRUE(r.has_result) << Describe(r);
    EXPECT_EQ(r.tokens, (*expected_)[i].tokens);
    EXPECT_EQ(r.text, (*expected_)[i].text);
    EXPECT_EQ(r.result.finish_reason(), (*expected_)[i].finish_reason);
    EXPECT_EQ(r.result.usage().completion_tokens(),
              static_cast<int>(r.tokens.size()));
    EXPECT_EQ(r.result.seed(), requests[i].sampling().seed());
    EXPECT_GT(r.result.timings().ttft_ms(), 0.0);
    EXPECT_GE(r.result.timings().total_ms(), r.result.timings().ttft_ms());
    prefill_workers.insert(r.result.prefill_worker().worker_id());
    decode_workers.insert(r.result.decode_worker().worker_id());
    if (shape.both > 0) {
      EXPECT_EQ(r.result.kv_transport(), v1::KV_TRANSPORT_LOCAL);
      EXPECT_EQ(r.result.prefill_worker().worker_id(),
                r.result.decode_worker().worker_id());
      EXPECT_EQ(r.result.timings().kv_transfer_bytes(), 0);
      EXPECT_EQ(r.result.timings().reserve_kv_ms(), 0.0);
    } else {
      EXPECT_EQ(r.result.kv_transport(), v1::KV_TRANSPORT_HOST_TCP);
      EXPECT_NE(r.result.prefill_worker().worker_id(),
                r.result.decode_worker().worker_id());
      EXPECT_GT(r.result.timings().kv_transfer_bytes(), 0);
      EXPECT_GT(r.result.timings().kv_transfer_ms(), 0.0);
      // The ReserveKv round trip overlaps the Prefill, or (reserving
      // first, or waiting for a pool with no room) is part of the time
      // before it.
      EXPECT_GT(r.result.timings().reserve_kv_ms(), 0.0);
      const bool beside = r.result.timings().reserve_kv_beside_prefill();
      if (shape.reserve_first) {
        EXPECT_FALSE(beside);
      }
      if (beside) {
        ++reserved_beside;
      } else {
        EXPECT_LE(r.result.timings().reserve_kv_ms(),
                  r.result.timings().queue_ms());
      }
    }
  }
  // By default a request whose decode pool has room reserves beside its
  // Prefill (the first ones, at least, find room).
  if (shape.both == 0 && !shape.reserve_first) {
    EXPECT_GT(reserved_beside, 0);
  }
  // Every worker of each pool took part.
  EXPECT_EQ(static_cast<int>(prefill_workers.size()),
            shape.prefill + shape.both);
  EXPECT_EQ(static_cast<int>(decode_workers.size()), shape.decode + shape.both);
  EXPECT_TRUE((*cluster)->WaitAllFree(absl::Seconds(10)).ok())
      << (*cluster)->WaitAllFree(absl::ZeroDuration());
  const absl::Status stopped = (*cluster)->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

TEST_F(ClusterEquivalenceTest, SameTokensAsInProcessEngine) {
  for (const Shape& shape : kShapes) {
    SCOPED_TRACE(shape.name);
    CheckShape(shape);
  }
}

}  // namespace
}  // namespace baton::testing
