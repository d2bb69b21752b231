// Workers with the simulated engine (baton-worker --engine=simulated
// --profile=FILE): the real coordinator, worker services, KV reservations
// and transfers, with steps that compute nothing and take the profile's
// time. Every request must complete with the tokens the simulated model
// prefers (SimulatedToken), whichever workers served it, and every block
// must be free afterwards.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/test_pki.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster/cluster_test_util.h"
#include "tests/cluster/local_cluster.h"
#include "worker/engine/cost_profile.h"
#include "worker/engine/simulated_runner.h"

namespace baton::testing {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kVocab = 49152;  // the default model's

// A prompt of `len` ordinary token ids, different for each `seed`.
v1::GenerateRequest TokenRequest(int seed, int len, int max_tokens) {
  v1::GenerateRequest request;
  for (int i = 0; i < len; ++i) {
    request.mutable_token_ids()->add_token_ids(
        1000 + (seed * 7919 + i * 104729) % 30000);
  }
  request.mutable_sampling()->set_max_tokens(max_tokens);
  request.mutable_sampling()->set_temperature(0);
  request.mutable_sampling()->set_ignore_eos(true);
  return request;
}

std::vector<int32_t> Expected(const v1::GenerateRequest& request) {
  const auto& prompt = request.token_ids().token_ids();
  std::vector<int32_t> out;
  int32_t last = prompt[prompt.size() - 1];
  for (int i = 0; i < request.sampling().max_tokens(); ++i) {
    last = SimulatedToken(prompt.size() - 1 + i, last, kVocab);
    out.push_back(last);
  }
  return out;
}

// Writes a profile of fast simulated steps into `dir`; returns its path.
std::string WriteProfile(const TempDir& dir) {
  WorkerProfile profile;
  profile.prefill.c0 = 0.001;
  profile.prefill.c1 = 2e-5;  // 50,000 prompt tokens/s
  profile.decode.c0 = 0.002;
  profile.decode.c2 = 1e-5;
  profile.kv_bytes_per_token = 23040;
  profile.transfer_alpha_s = 0.005;
  profile.transfer_bytes_per_s = 5e9;
  const std::string path = dir.File("profile.json");
  EXPECT_TRUE(WriteFileAtomically(path, ProfileJson(profile).dump()).ok());
  return path;
}

// Sends kRequests concurrent streams of varied lengths to a cluster of
// simulated workers (`prefill` + `decode` of them, with `extra_flags`):
// each gets the simulated model's tokens, and every block is free after.
void ConcurrentStreams(int prefill, int decode, int requests_to_send,
                       const std::vector<std::string>& extra_flags) {
  auto dir = TempDir::Create("baton-sim-profile");
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::string path = WriteProfile(*dir);
  LocalClusterOptions options;
  options.prefill = prefill;
  options.decode = decode;
  // As scripts/scale_bench.py runs them: pools committed at start.
  options.worker_flags = {"--engine=simulated", "--profile=" + path,
                          "--kv_prefault"};
  options.worker_flags.insert(options.worker_flags.end(), extra_flags.begin(),
                              extra_flags.end());
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;

  const int kRequests = requests_to_send;
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < kRequests; ++i) {
    requests.push_back(TokenRequest(i, 20 + i % 200, 8 + i % 24));
  }
  std::vector<StreamResult> results(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back(
        [&, i] { results[i] = RunGenerate(c.baton(), requests[i]); });
  }
  for (std::thread& t : threads) t.join();
  std::vector<std::string> decode_workers;
  for (int i = 0; i < kRequests; ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(results[i].status.ok()) << Describe(results[i]);
    EXPECT_EQ(results[i].tokens, Expected(requests[i])) << Describe(results[i]);
    EXPECT_EQ(results[i].result.finish_reason(), v1::FINISH_REASON_LENGTH);
    decode_workers.push_back(results[i].result.decode_worker().worker_id());
  }
  std::sort(decode_workers.begin(), decode_workers.end());
  decode_workers.erase(
      std::unique(decode_workers.begin(), decode_workers.end()),
      decode_workers.end());
  EXPECT_GE(decode_workers.size(), 2u) << "one decode worker took everything";
  EXPECT_TRUE(c.WaitAllFree(DefaultTestDeadline()).ok());
  EXPECT_TRUE(c.Stop().ok());
}

TEST(ClusterSimulatedTest, ManyConcurrentStreamsOnSimulatedWorkers) {
  ConcurrentStreams(2, 4, 96, {});
}

// --simulate_kv_transfers: the handoffs carry no bytes (simulated layer
// frames) and take the profile's transfer time; the tokens and the
// accounting are those of a cluster that moves the bytes.
TEST(ClusterSimulatedTest, SimulatedTransfersCarryNoBytes) {
  ConcurrentStreams(1, 2, 32, {"--simulate_kv_transfers"});
  // A decode worker without the flag takes real KV only: the prefill
  // worker's handoffs to it are refused, so they carried no bytes.
  auto dir = TempDir::Create("baton-sim-profile");
  ASSERT_TRUE(dir.ok()) << dir.status();
  LocalClusterOptions options;
  options.prefill = 1;
  options.decode = 1;
  options.worker_flags = {"--engine=simulated",
                          "--profile=" + WriteProfile(*dir)};
  options.flags_of_worker[0] = {"--simulate_kv_transfers"};
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  StreamResult r = RunGenerate((*cluster)->baton(), TokenRequest(1, 40, 4));
  EXPECT_EQ(r.result.finish_reason(), v1::FINISH_REASON_ERROR) << Describe(r);
  EXPECT_THAT(Describe(r), HasSubstr("this receiver takes real KV only"));
  EXPECT_TRUE((*cluster)->WaitAllFree(DefaultTestDeadline()).ok());
  EXPECT_TRUE((*cluster)->Stop().ok());
}

TEST(ClusterSimulatedTest, AWorkerRefusesABadEngineOrProfile) {
  auto dir = TempDir::Create("baton-sim-profile");
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::string bad = dir->File("bad.json");
  ASSERT_TRUE(WriteFileAtomically(bad, R"({"prefill": {"c0": -1}})").ok());
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--engine=quantum"},
        std::vector<std::string>{"--engine=simulated"},
        std::vector<std::string>{"--simulate_kv_transfers"},
        std::vector<std::string>{"--engine=simulated", "--profile=" + bad}}) {
    LocalClusterOptions options;
    options.prefill = 0;
    options.decode = 0;
    options.both = 1;
    options.wait_healthy = false;
    options.worker_flags = flags;
    auto cluster = LocalCluster::Start(options);
    // The worker exits at once with status 2 (bad flags), before it
    // listens; its message, naming the flag, is on its stderr.
    EXPECT_FALSE(cluster.ok()) << flags.back();
    EXPECT_THAT(cluster.status().message(), HasSubstr("wait status 512"))
        << flags.back();
  }
}

}  // namespace
}  // namespace baton::testing
