#include "cli/status_command.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <sstream>
#include <string>

#include "absl/synchronization/mutex.h"
#include "baton/v1/api.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::cli {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

v1::WorkerStatus Worker(const std::string& id, v1::WorkerRole role,
                        v1::WorkerHealth health, int64_t free, int64_t total) {
  v1::WorkerStatus w;
  w.mutable_worker()->set_worker_id(id);
  w.mutable_worker()->set_address("10.0.0." + id.substr(2) + ":7000");
  w.set_role(role);
  w.set_health(health);
  w.set_model_id("smollm2");
  w.mutable_load()->set_kv_blocks_free(free);
  w.mutable_load()->set_kv_blocks_total(total);
  w.mutable_load()->set_running_sequences(3);
  w.mutable_load()->set_queued_prefill_tokens(512);
  w.mutable_load()->set_prefill_tokens_per_second(812.5);
  w.set_epoch(7);
  w.set_last_heartbeat_age_ms(250.0);
  return w;
}

// GetClusterStatus answers with three workers (the third one down, listed
// only with include_down) or with `error` when it is not OK.
class FakeBaton final : public v1::Baton::Service {
 public:
  grpc::Status GetClusterStatus(
      grpc::ServerContext*, const v1::GetClusterStatusRequest* request,
      v1::GetClusterStatusResponse* response) override {
    absl::MutexLock lock(&mu_);
    ++calls_;
    include_down_ = request->include_down();
    if (!error_.ok()) return error_;
    *response->add_workers() = Worker("w-1", v1::WORKER_ROLE_PREFILL,
                                      v1::WORKER_HEALTH_HEALTHY, 12, 64);
    *response->add_workers() = Worker("w-2", v1::WORKER_ROLE_DECODE,
                                      v1::WORKER_HEALTH_SUSPECT, 100, 128);
    if (request->include_down()) {
      *response->add_workers() =
          Worker("w-3", v1::WORKER_ROLE_BOTH, v1::WORKER_HEALTH_DOWN, 32, 32);
    }
    response->set_active_requests(5);
    return grpc::Status::OK;
  }

  void set_error(grpc::Status error) {
    absl::MutexLock lock(&mu_);
    error_ = std::move(error);
  }
  bool include_down() const {
    absl::MutexLock lock(&mu_);
    return include_down_;
  }
  int calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  mutable absl::Mutex mu_;
  grpc::Status error_ ABSL_GUARDED_BY(mu_);
  bool include_down_ ABSL_GUARDED_BY(mu_) = false;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

class StatusCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override { server_->Shutdown(); }

  StatusOptions Options() const {
    StatusOptions o;
    o.server = "127.0.0.1:" + std::to_string(port_);
    o.deadline_ms = 10000;
    return o;
  }

  FakeBaton service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(StatusCommandTest, JsonListsWorkersWithLoad) {
  StatusOptions o = Options();
  o.json = true;
  std::ostringstream out;
  ASSERT_TRUE(RunStatus(o, out).ok());
  EXPECT_FALSE(service_.include_down());
  const Json j = Json::parse(out.str(), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out.str();
  EXPECT_EQ(j["active_requests"], 5);
  ASSERT_EQ(j["workers"].size(), 2u);
  const Json& w = j["workers"][0];
  EXPECT_EQ(w["id"], "w-1");
  EXPECT_EQ(w["address"], "10.0.0.1:7000");
  EXPECT_EQ(w["role"], "prefill");
  EXPECT_EQ(w["healthy"], true);
  EXPECT_EQ(w["health"], "healthy");
  EXPECT_EQ(w["kv_blocks_free"], 12);
  EXPECT_EQ(w["kv_blocks_total"], 64);
  EXPECT_EQ(w["running_sequences"], 3);
  EXPECT_EQ(w["queued_prefill_tokens"], 512);
  EXPECT_EQ(w["prefill_tokens_per_second"], 812.5);
  EXPECT_EQ(w["epoch"], 7);
  EXPECT_EQ(w["model_id"], "smollm2");
  const Json& suspect = j["workers"][1];
  EXPECT_EQ(suspect["role"], "decode");
  EXPECT_EQ(suspect["healthy"], false);
  EXPECT_EQ(suspect["health"], "suspect");
  EXPECT_EQ(suspect["kv_blocks_free"], 100);
  EXPECT_EQ(suspect["kv_blocks_total"], 128);
}

TEST_F(StatusCommandTest, IncludeDownIsSentAndShown) {
  StatusOptions o = Options();
  o.json = true;
  o.include_down = true;
  std::ostringstream out;
  ASSERT_TRUE(RunStatus(o, out).ok());
  EXPECT_TRUE(service_.include_down());
  const Json j = Json::parse(out.str(), nullptr, false);
  ASSERT_EQ(j["workers"].size(), 3u);
  EXPECT_EQ(j["workers"][2]["role"], "both");
  EXPECT_EQ(j["workers"][2]["health"], "down");
  EXPECT_EQ(j["workers"][2]["healthy"], false);
}

TEST_F(StatusCommandTest, TableHasHeaderAndOneRowPerWorker) {
  std::ostringstream out;
  ASSERT_TRUE(RunStatus(Options(), out).ok());
  const std::string table = out.str();
  EXPECT_THAT(table, HasSubstr("ID"));
  EXPECT_THAT(table, HasSubstr("KV FREE/TOTAL"));
  EXPECT_THAT(table, HasSubstr("HEARTBEAT"));
  EXPECT_THAT(table, HasSubstr("w-1"));
  EXPECT_THAT(table, HasSubstr("10.0.0.2:7000"));
  EXPECT_THAT(table, HasSubstr("12/64"));
  EXPECT_THAT(table, HasSubstr("100/128"));
  EXPECT_THAT(table, HasSubstr("suspect"));
  EXPECT_THAT(table, HasSubstr("250 ms ago"));
  EXPECT_THAT(table, HasSubstr("2 workers, 5 active requests"));
  EXPECT_THAT(table, Not(HasSubstr("w-3")));
  // Header plus two workers plus the summary.
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 4);
}

TEST_F(StatusCommandTest, RpcErrorKeepsCodeAndMessage) {
  service_.set_error(
      grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator draining"));
  std::ostringstream out;
  const absl::Status status = RunStatus(Options(), out);
  EXPECT_EQ(status.ToString(), "UNAVAILABLE: coordinator draining");
  EXPECT_EQ(out.str(), "");
}

TEST_F(StatusCommandTest, MissingServerIsInvalidArgument) {
  StatusOptions o = Options();
  o.server.clear();
  std::ostringstream out;
  EXPECT_EQ(RunStatus(o, out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(service_.calls(), 0);
}

}  // namespace
}  // namespace baton::cli
