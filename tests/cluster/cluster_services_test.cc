// Every server of a cluster (the coordinator and each worker) answers the
// standard health check and lists its services through server reflection;
// `baton status` and GetClusterStatus report the workers' roles and pools.
#include <grpcpp/grpcpp.h>
#include <sys/wait.h>

#include <filesystem>
#include <set>
#include <string>

#include "common/test_util.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/cluster/local_cluster.h"

namespace baton::testing {
namespace {

using ::testing::IsSupersetOf;

grpc::health::v1::HealthCheckResponse::ServingStatus Health(
    const std::string& address) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status =
      stub->Check(&context, grpc::health::v1::HealthCheckRequest(), &response);
  EXPECT_TRUE(status.ok()) << address << ": " << status.error_message();
  return response.status();
}

std::set<std::string> ReflectedServices(const std::string& address) {
  auto stub = grpc::reflection::v1alpha::ServerReflection::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
  auto stream = stub->ServerReflectionInfo(&context);
  grpc::reflection::v1alpha::ServerReflectionRequest request;
  request.set_list_services("*");
  EXPECT_TRUE(stream->Write(request));
  stream->WritesDone();
  std::set<std::string> names;
  grpc::reflection::v1alpha::ServerReflectionResponse response;
  while (stream->Read(&response)) {
    for (const auto& service : response.list_services_response().service()) {
      names.insert(service.name());
    }
  }
  const grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << address << ": " << status.error_message();
  return names;
}

TEST(ClusterServicesTest, HealthAndReflectionOnEveryServer) {
  auto cluster = LocalCluster::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_EQ(Health((*cluster)->address()),
            grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_THAT(ReflectedServices((*cluster)->address()),
              IsSupersetOf({"baton.v1.Baton", "baton.v1.Coordinator",
                            "grpc.health.v1.Health"}));
  for (const LocalCluster::Worker& w : (*cluster)->workers()) {
    SCOPED_TRACE(w.role);
    EXPECT_EQ(Health(w.address),
              grpc::health::v1::HealthCheckResponse::SERVING);
    EXPECT_THAT(ReflectedServices(w.address),
                IsSupersetOf({"baton.v1.Worker", "grpc.health.v1.Health"}));
  }
  const absl::Status stopped = (*cluster)->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

TEST(ClusterServicesTest, ClusterStatusListsRolesAndPools) {
  LocalClusterOptions options;
  options.prefill = 1;
  options.decode = 1;
  options.both = 1;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  v1::GetClusterStatusResponse status;
  grpc::ClientContext context;
  ASSERT_TRUE((*cluster)->baton().GetClusterStatus(&context, {}, &status).ok());
  ASSERT_EQ(status.workers_size(), 3);
  std::multiset<v1::WorkerRole> roles;
  for (const v1::WorkerStatus& w : status.workers()) {
    roles.insert(w.role());
    EXPECT_EQ(w.health(), v1::WORKER_HEALTH_HEALTHY);
    EXPECT_GT(w.load().kv_blocks_total(), 0);
    EXPECT_EQ(w.load().kv_blocks_free(), w.load().kv_blocks_total());
    EXPECT_EQ(w.kv_layout().num_layers(), 30);
    EXPECT_LT(w.last_heartbeat_age_ms(), 1000.0);
    EXPECT_GE((*cluster)->WorkerIndex(w.worker().address()), 0);
  }
  EXPECT_EQ(roles, (std::multiset<v1::WorkerRole>{v1::WORKER_ROLE_PREFILL,
                                                  v1::WORKER_ROLE_DECODE,
                                                  v1::WORKER_ROLE_BOTH}));
  const absl::Status stopped = (*cluster)->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

// The worker's exit status for `device`, started standalone on the default
// model; -1 if it is still running after 60 s (it then serves, which a
// refused device must not).
int WorkerExitStatus(const std::string& device) {
  auto child =
      ChildProcess::Start({BinaryDir() + "/baton-worker", "--device=" + device,
                           "--model=" + DefaultModelPath(),
                           "--listen=127.0.0.1:0", "--kv_listen=127.0.0.1:0"});
  EXPECT_TRUE(child.ok()) << child.status();
  if (!child.ok()) return -1;
  auto status = (*child)->Wait(absl::Seconds(60));
  if (!status.ok() || !WIFEXITED(*status)) return -1;
  return WEXITSTATUS(*status);
}

TEST(ClusterServicesTest, WorkerRefusesADeviceItCannotUse) {
  EXPECT_EQ(WorkerExitStatus("gpu"), 2) << "an unknown device is a flag error";
  EXPECT_EQ(WorkerExitStatus("cuda:x"), 2);
  if (std::filesystem::exists("/dev/nvidiactl")) {
    GTEST_SKIP() << "this host has a GPU: cuda:0 would serve";
  }
  // Built with CUDA: exits 1 naming the CUDA error; without: 2 naming the
  // build option. Either way before serving.
  const int status = WorkerExitStatus("cuda:0");
  EXPECT_TRUE(status == 1 || status == 2) << status;
}

}  // namespace
}  // namespace baton::testing
