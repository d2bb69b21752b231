// Real clusters on loopback under faults: client cancel, deadline expiry, a
// decode pool without room, a squatting reservation the coordinator never
// made, a worker killed with SIGKILL mid-request, empty worker pools and
// malformed requests. After each, every surviving worker must report
// kv_blocks_free == kv_blocks_total and no leased request.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
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

using ::testing::HasSubstr;

v1::GenerateRequest LongRequest(int i, int max_tokens) {
  v1::GenerateRequest request = ChatRequest(
      absl::StrCat("Tell a long story number ", i, "."), max_tokens, 0.7,
      /*seed=*/77 + static_cast<uint64_t>(i));
  request.mutable_sampling()->set_ignore_eos(true);
  return request;
}

std::unique_ptr<LocalCluster> StartOrDie(const LocalClusterOptions& options) {
  auto cluster = LocalCluster::Start(options);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? std::move(*cluster) : nullptr;
}

void ExpectAllFree(LocalCluster& cluster) {
  const absl::Status free = cluster.WaitAllFree(absl::Seconds(10));
  EXPECT_TRUE(free.ok()) << free;
}

// Every process still running stops cleanly on SIGTERM.
void ExpectCleanStop(LocalCluster& cluster) {
  const absl::Status stopped = cluster.Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

TEST(ClusterFaultTest, ClientCancelMidStreamFreesEveryBlock) {
  auto cluster = StartOrDie({});
  ASSERT_NE(cluster, nullptr);
  std::vector<StreamResult> results(4);
  std::vector<std::thread> clients;
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&, i] {
      StreamOptions options;
      options.cancel_after_tokens = 3;
      results[static_cast<size_t>(i)] =
          RunGenerate(cluster->baton(), LongRequest(i, 2000), options);
    });
  }
  for (std::thread& t : clients) t.join();
  for (const StreamResult& r : results) {
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::CANCELLED)
        << r.status.error_message();
    EXPECT_GE(r.tokens.size(), 3u);
    EXPECT_LT(r.tokens.size(), 2000u);
  }
  ExpectAllFree(*cluster);
  ExpectCleanStop(*cluster);
}

TEST(ClusterFaultTest, DeadlineExpiryFreesEveryBlock) {
  auto cluster = StartOrDie({});
  ASSERT_NE(cluster, nullptr);
  StreamOptions options;
  options.deadline = absl::Milliseconds(600);
  const StreamResult r =
      RunGenerate(cluster->baton(), LongRequest(0, 2000), options);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << r.status.error_message();
  EXPECT_FALSE(r.has_result);
  ExpectAllFree(*cluster);
  ExpectCleanStop(*cluster);
}

// 4 MiB of KV is 11 blocks of 16 tokens on the decode worker.
TEST(ClusterFaultTest, DecodePoolWithoutRoom) {
  LocalClusterOptions options;
  options.decode_kv_cache_mib = 4;
  options.coordinator_flags = {"--queue_timeout_ms=300"};
  auto cluster = StartOrDie(options);
  ASSERT_NE(cluster, nullptr);

  // More than the whole pool: refused at once, naming the numbers.
  const absl::Time start = absl::Now();
  StreamResult too_big = RunGenerate(cluster->baton(), LongRequest(0, 500));
  EXPECT_EQ(too_big.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(too_big.status.error_message(), HasSubstr("KV blocks"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  ExpectAllFree(*cluster);

  // Each request needs more than half the pool (prompt + 90 tokens: 8
  // blocks), so they run one at a time and those that wait past the queue
  // timeout fail.
  std::vector<StreamResult> results(4);
  std::vector<std::thread> clients;
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&, i] {
      results[static_cast<size_t>(i)] =
          RunGenerate(cluster->baton(), LongRequest(i, 90));
    });
  }
  for (std::thread& t : clients) t.join();
  int ok = 0;
  int exhausted = 0;
  for (const StreamResult& r : results) {
    if (r.status.ok() && r.has_result &&
        r.result.finish_reason() == v1::FINISH_REASON_LENGTH) {
      ++ok;
    } else if (r.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++exhausted;
      EXPECT_THAT(r.status.error_message(),
                  HasSubstr("no decode worker had room"));
    } else {
      ADD_FAILURE() << "unexpected end: " << r.status.error_code() << " "
                    << r.status.error_message();
    }
  }
  EXPECT_GE(ok, 1);
  EXPECT_GE(exhausted, 1);
  ExpectAllFree(*cluster);
  ExpectCleanStop(*cluster);
}

// A reservation made directly on a decode worker, which the coordinator
// never made: the worker refuses the coordinator's reservation for lack of
// blocks until its next heartbeat, where the coordinator lists the squatter
// as orphaned and the worker frees it.
TEST(ClusterFaultTest, OrphanedReservationIsFreedAndRequestsProceed) {
  LocalClusterOptions options;
  options.decode_kv_cache_mib = 4;
  options.heartbeat_ms = 300;
  options.lease_ttl_ms = 3000;
  auto cluster = StartOrDie(options);
  ASSERT_NE(cluster, nullptr);
  LocalCluster::Worker& decode = cluster->workers()[1];
  ASSERT_EQ(decode.role, "decode");
  v1::ReserveKvRequest squat;
  squat.set_request_id("squatter");
  squat.set_num_prompt_tokens(100);
  squat.set_max_tokens(28);
  v1::ReserveKvResponse reserved;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(decode.stub->ReserveKv(&context, squat, &reserved).ok());
  }
  EXPECT_EQ(reserved.blocks_reserved(), 8);
  const StreamResult r = RunGenerate(cluster->baton(), LongRequest(0, 20));
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens.size(), 20u);
  ExpectAllFree(*cluster);
  ExpectCleanStop(*cluster);
}

// Requests on a decode worker that is SIGKILLed end with UNAVAILABLE (the
// client may retry: streamed tokens cannot be taken back, so the
// coordinator does not replay them elsewhere); requests on the other decode
// worker complete; the survivors leak nothing; new requests are served.
TEST(ClusterFaultTest, DecodeWorkerKilledMidRequest) {
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
TEST(ClusterFaultTest, PrefillWorkerKilledMidPrefill) {
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

TEST(ClusterFaultTest, EmptyPoolsAreUnavailableAtOnce) {
  for (const bool prefill_missing : {true, false}) {
    LocalClusterOptions options;
    options.prefill = prefill_missing ? 0 : 1;
    options.decode = prefill_missing ? 1 : 0;
    auto cluster = StartOrDie(options);
    ASSERT_NE(cluster, nullptr);
    const absl::Time start = absl::Now();
    const StreamResult r = RunGenerate(cluster->baton(), LongRequest(0, 4));
    EXPECT_LT(absl::Now() - start, absl::Seconds(1));
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(r.status.error_message(),
                HasSubstr(prefill_missing ? "no healthy prefill worker"
                                          : "no healthy decode worker"));
    ExpectAllFree(*cluster);
  }
}

TEST(ClusterFaultTest, MalformedRequestsNameTheField) {
  LocalClusterOptions options;
  options.prefill = 0;
  options.decode = 0;
  options.both = 1;
  auto cluster = StartOrDie(options);
  ASSERT_NE(cluster, nullptr);
  struct Case {
    std::string name;
    v1::GenerateRequest request;
    grpc::StatusCode code;
    std::string field;
  };
  std::vector<Case> cases;
  const v1::GenerateRequest valid = LongRequest(0, 4);
  {
    v1::GenerateRequest r = valid;
    r.clear_prompt();
    cases.push_back(
        {"no prompt", r, grpc::StatusCode::INVALID_ARGUMENT, "prompt"});
  }
  {
    v1::GenerateRequest r = valid;
    r.set_text("");
    cases.push_back(
        {"empty text", r, grpc::StatusCode::INVALID_ARGUMENT, "text"});
  }
  {
    v1::GenerateRequest r = valid;
    r.mutable_sampling()->set_top_p(1.5);
    cases.push_back(
        {"top_p", r, grpc::StatusCode::INVALID_ARGUMENT, "sampling.top_p"});
  }
  {
    v1::GenerateRequest r = valid;
    r.mutable_sampling()->set_temperature(-1);
    cases.push_back({"temperature", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "sampling.temperature"});
  }
  {
    v1::GenerateRequest r = valid;
    r.mutable_sampling()->set_max_tokens(0);
    cases.push_back({"max_tokens", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "sampling.max_tokens"});
  }
  {
    v1::GenerateRequest r = valid;
    r.mutable_sampling()->set_max_tokens(100000);
    cases.push_back(
        {"context", r, grpc::StatusCode::INVALID_ARGUMENT, "context"});
  }
  {
    v1::GenerateRequest r = valid;
    r.mutable_token_ids()->add_token_ids(10);
    r.mutable_token_ids()->add_token_ids(49152);
    cases.push_back({"token id", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "token_ids.token_ids[1]"});
  }
  {
    v1::GenerateRequest r = valid;
    r.mutable_chat()->mutable_messages(0)->set_role("robot");
    cases.push_back({"role", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "chat.messages[0].role"});
  }
  {
    v1::GenerateRequest r = valid;
    r.set_model("no-such-model");
    cases.push_back({"model", r, grpc::StatusCode::NOT_FOUND, "model"});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const StreamResult r = RunGenerate(cluster->baton(), c.request);
    EXPECT_EQ(r.status.error_code(), c.code) << r.status.error_message();
    EXPECT_THAT(r.status.error_message(), HasSubstr(c.field));
    EXPECT_EQ(r.messages, 0);
  }
  // The cluster still serves, and nothing leaked.
  const StreamResult ok = RunGenerate(cluster->baton(), valid);
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
  ExpectAllFree(*cluster);

  // Tokenize and ListModels.
  v1::TokenizeRequest tokenize;
  tokenize.set_text("Hello world");
  v1::TokenizeResponse tokens;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(cluster->baton().Tokenize(&context, tokenize, &tokens).ok());
  }
  ASSERT_GT(tokens.token_ids_size(), 0);
  EXPECT_EQ(tokens.pieces_size(), tokens.token_ids_size());
  v1::ListModelsResponse models;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(cluster->baton().ListModels(&context, {}, &models).ok());
  }
  ASSERT_EQ(models.models_size(), 1);
  EXPECT_EQ(models.models(0).colocated_workers(), 1);
  EXPECT_EQ(models.models(0).vocab_size(), 49152);
}

}  // namespace
}  // namespace baton::testing
