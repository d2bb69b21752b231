// Real clusters on loopback under faults: client cancel, deadline expiry, a
// decode pool without room, a squatting reservation the coordinator never
// made, empty worker pools and malformed requests (workers dying or
// freezing: cluster_worker_fault_test.cc). After each, every surviving worker
// must report kv_blocks_free == kv_blocks_total and no leased request.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster/cluster_fault_util.h"
#include "tests/cluster/cluster_test_util.h"
#include "tests/cluster/local_cluster.h"

namespace baton::testing {
namespace {

using ::testing::HasSubstr;

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

  // More than the whole pool: refused at once (not queued until the queue
  // timeout) as a request to change (not to retry), naming the numbers.
  StreamResult too_big = RunGenerate(cluster->baton(), LongRequest(0, 500));
  EXPECT_EQ(too_big.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(too_big.status.error_message(),
              HasSubstr("KV blocks; the largest decode worker has 11 (176 "
                        "tokens: max_tokens <= "));
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
                  HasSubstr("no worker had room for the request within"));
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

// The decode worker reserves the blocks but its ReserveKv reply is lost
// (fault point kv_reserved: UNAVAILABLE while the blocks stay reserved).
// The request state machine frees them at once (Worker.Cancel of the
// reservation), and the request is reserved again and answered with the
// tokens of a fault-free run. Heartbeats are 30 s apart, so only that
// Cancel, not the heartbeat's orphan sweep, can free the blocks before the
// 10 s queue timeout (the worker refuses a second reservation of a request
// id it still holds).
//
// The same for a reservation made beside the Prefill (the default; the
// other with --overlap_reserve_kv=false): the Prefill already running is
// cancelled, and the next attempt reserves first.
TEST(ClusterFaultTest, LostReserveKvReplyIsFreedAndTheRequestProceeds) {
  for (const bool beside : {false, true}) {
    SCOPED_TRACE(beside ? "beside the Prefill" : "reserved first");
    LocalClusterOptions options;
    options.heartbeat_ms = 30000;
    options.lease_ttl_ms = 120000;
    options.coordinator_flags = {"--queue_timeout_ms=10000"};
    if (!beside) {
      options.coordinator_flags.push_back("--overlap_reserve_kv=false");
    }
    options.flags_of_worker[1] = {"--fault=kv_reserved:error"};
    auto cluster = StartOrDie(options);
    ASSERT_NE(cluster, nullptr);
    ASSERT_EQ(cluster->workers()[1].role, "decode");
    v1::GenerateRequest request = LongRequest(0, 24);
    request.mutable_sampling()->set_temperature(0);
    const StreamResult faulted = RunGenerate(cluster->baton(), request);
    ASSERT_TRUE(faulted.status.ok()) << faulted.status.error_message();
    EXPECT_EQ(faulted.tokens.size(), 24u);
    if (beside) {
      // Started over once: before the first token (a retry) or, on a host
      // slow enough that it was out already, after it (a migration).
      EXPECT_EQ(faulted.result.retries() + faulted.result.migrations(), 1);
    }
    EXPECT_FALSE(faulted.result.timings().reserve_kv_beside_prefill());
    ExpectAllFree(*cluster);
    const StreamResult clean = RunGenerate(cluster->baton(), request);
    ASSERT_TRUE(clean.status.ok()) << clean.status.error_message();
    EXPECT_EQ(clean.result.timings().reserve_kv_beside_prefill(), beside);
    EXPECT_EQ(faulted.tokens, clean.tokens);
    EXPECT_EQ(faulted.text, clean.text);
    ExpectAllFree(*cluster);
    ExpectCleanStop(*cluster);
  }
}

TEST(ClusterFaultTest, EmptyPoolsAreUnavailableAtOnce) {
  for (const bool prefill_missing : {true, false}) {
    LocalClusterOptions options;
    options.prefill = prefill_missing ? 0 : 1;
    options.decode = prefill_missing ? 1 : 0;
    // A request that queued for a worker would wait an hour, past ctest's
    // timeout: only the immediate refusal ends it.
    options.coordinator_flags = {"--queue_timeout_ms=3600000"};
    auto cluster = StartOrDie(options);
    ASSERT_NE(cluster, nullptr);
    StreamOptions stream_options;
    stream_options.deadline = absl::InfiniteDuration();
    const StreamResult r =
        RunGenerate(cluster->baton(), LongRequest(0, 4), stream_options);
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
  // Limits at the door (the defaults of baton-coordinator's flags).
  {
    v1::GenerateRequest r = valid;
    r.set_request_id(std::string(1000, 'x'));
    cases.push_back({"long request_id", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "request_id: 1000 bytes, the limit is 128"});
  }
  {
    v1::GenerateRequest r = valid;
    for (int i = 0; i < 1000; ++i) {
      r.mutable_sampling()->add_stop(std::string(200, 'a' + i % 26));
    }
    cases.push_back({"stop strings", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "sampling.stop: 1000 strings, the limit is 16"});
  }
  {
    v1::GenerateRequest r = valid;
    r.mutable_sampling()->add_stop(std::string(300, 'a'));
    cases.push_back({"stop string bytes", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "sampling.stop[0]: 300 bytes, the limit is 256"});
  }
  {
    v1::GenerateRequest r = valid;
    r.set_text(std::string(5 << 20, 'a'));
    cases.push_back({"message size", r, grpc::StatusCode::RESOURCE_EXHAUSTED,
                     "Received message larger than max"});
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
