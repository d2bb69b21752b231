// Every server of a cluster (the coordinator's public and control ports and
// each worker) answers the standard health check, per service too, and lists
// and describes its services through server reflection; the control plane
// is not on the public port;
// `baton status` and GetClusterStatus report the workers' roles and pools;
// SIGTERM drains the coordinator.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/test_util.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/cluster/cluster_fault_util.h"
#include "tests/cluster/cluster_test_util.h"
#include "tests/cluster/local_cluster.h"

namespace baton::testing {
namespace {

using ::testing::Contains;
using ::testing::IsSupersetOf;
using ::testing::Not;

// The status a health check of `service` ("" for the server) reports.
grpc::health::v1::HealthCheckResponse::ServingStatus Health(
    const std::string& address, const std::string& service = "") {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  EXPECT_TRUE(status.ok()) << address << " '" << service
                           << "': " << status.error_message();
  return response.status();
}

// One reflection request's answers (a stream of one request).
std::vector<grpc::reflection::v1alpha::ServerReflectionResponse> Reflect(
    const std::string& address,
    const grpc::reflection::v1alpha::ServerReflectionRequest& request) {
  auto stub = grpc::reflection::v1alpha::ServerReflection::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
  auto stream = stub->ServerReflectionInfo(&context);
  EXPECT_TRUE(stream->Write(request));
  stream->WritesDone();
  std::vector<grpc::reflection::v1alpha::ServerReflectionResponse> answers;
  grpc::reflection::v1alpha::ServerReflectionResponse response;
  while (stream->Read(&response)) answers.push_back(response);
  const grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << address << ": " << status.error_message();
  return answers;
}

std::set<std::string> ReflectedServices(const std::string& address) {
  grpc::reflection::v1alpha::ServerReflectionRequest request;
  request.set_list_services("*");
  std::set<std::string> names;
  for (const auto& response : Reflect(address, request)) {
    for (const auto& service : response.list_services_response().service()) {
      names.insert(service.name());
    }
  }
  return names;
}

// What `grpcurl describe SYMBOL` needs: the file that defines it. "" if
// the server sent it, else the error it answered.
std::string DescribeError(const std::string& address,
                          const std::string& symbol) {
  grpc::reflection::v1alpha::ServerReflectionRequest request;
  request.set_file_containing_symbol(symbol);
  const auto answers = Reflect(address, request);
  if (answers.empty()) return "no answer";
  const auto& answer = answers.front();
  if (answer.has_error_response()) {
    return answer.error_response().error_message();
  }
  return answer.file_descriptor_response().file_descriptor_proto_size() > 0
             ? ""
             : "no file descriptor";
}

// The public port serves the Baton API and nothing of the control plane;
// the control port serves the Coordinator service and not the API; every
// server's health service answers per service name and reflection can
// describe each service it lists, the health service's too.
TEST(ClusterServicesTest, HealthAndReflectionOnEveryServer) {
  auto cluster = LocalCluster::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  struct Server {
    std::string what;
    std::string address;
    std::string service;     // served here
    std::string not_served;  // must not be
  };
  std::vector<Server> servers = {{"public", (*cluster)->address(),
                                  "baton.v1.Baton", "baton.v1.Coordinator"},
                                 {"control", (*cluster)->control_address(),
                                  "baton.v1.Coordinator", "baton.v1.Baton"}};
  for (const LocalCluster::Worker& w : (*cluster)->workers()) {
    servers.push_back({w.role, w.address, "baton.v1.Worker", "baton.v1.Baton"});
  }
  for (const Server& server : servers) {
    SCOPED_TRACE(server.what);
    // A worker turns SERVING once registered, just after its coordinator
    // lists it healthy.
    const absl::Time guard = absl::Now() + absl::Seconds(30);
    while (Health(server.address) !=
               grpc::health::v1::HealthCheckResponse::SERVING &&
           absl::Now() < guard) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_EQ(Health(server.address),
              grpc::health::v1::HealthCheckResponse::SERVING);
    EXPECT_EQ(Health(server.address, server.service),
              grpc::health::v1::HealthCheckResponse::SERVING);
    const std::set<std::string> listed = ReflectedServices(server.address);
    EXPECT_THAT(listed, IsSupersetOf(std::vector<std::string>{
                            server.service, "grpc.health.v1.Health"}));
    EXPECT_THAT(listed, Not(Contains(server.not_served)));
    for (const std::string& symbol : listed) {
      EXPECT_EQ(DescribeError(server.address, symbol), "") << symbol;
    }
  }
  const absl::Status stopped = (*cluster)->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

// An API client on the public port cannot reach the control plane: no
// registering a rogue worker, no deregistering a real one.
TEST(ClusterServicesTest, ControlPlaneIsNotOnThePublicPort) {
  auto cluster = LocalCluster::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto on_public = v1::Coordinator::NewStub(grpc::CreateChannel(
      (*cluster)->address(), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext context;
    v1::RegisterWorkerRequest request;
    request.set_role(v1::WORKER_ROLE_DECODE);
    request.set_address("127.0.0.1:1");
    v1::RegisterWorkerResponse response;
    EXPECT_EQ(
        on_public->RegisterWorker(&context, request, &response).error_code(),
        grpc::StatusCode::UNIMPLEMENTED);
  }
  {
    grpc::ClientContext context;
    v1::DeregisterWorkerRequest request;
    v1::DeregisterWorkerResponse response;
    EXPECT_EQ(
        on_public->DeregisterWorker(&context, request, &response).error_code(),
        grpc::StatusCode::UNIMPLEMENTED);
  }
  // The cluster still has both workers and serves.
  absl::Status healthy = (*cluster)->WaitHealthy(2, absl::Seconds(30));
  EXPECT_TRUE(healthy.ok()) << healthy;
  const absl::Status stopped = (*cluster)->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

// Workers name themselves (a stable worker_id and a random incarnation), so
// a coordinator killed and restarted on the same ports gets every worker
// back exactly once, under the same name, with epochs it never handed out
// before; heartbeats the new coordinator does not know are told to
// register again. Each wait is on the registrations (bounded only against
// a hang), and a request succeeds after every restart.
TEST(ClusterServicesTest, CoordinatorRestartsGetEveryWorkerBackOnce) {
  LocalClusterOptions options;
  options.prefill = 2;
  options.decode = 1;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  constexpr int kWorkers = 3;
  auto status_now = [&] {
    v1::GetClusterStatusResponse status;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    const grpc::Status rpc =
        (*cluster)->baton().GetClusterStatus(&context, {}, &status);
    EXPECT_TRUE(rpc.ok()) << rpc.error_message();
    return status;
  };
  std::map<std::string, std::string> name_of_address;  // stable names
  uint64_t last_max_epoch = 0;
  const v1::GetClusterStatusResponse first = status_now();
  for (const v1::WorkerStatus& w : first.workers()) {
    name_of_address[w.worker().address()] = w.worker().worker_id();
    last_max_epoch = std::max(last_max_epoch, w.epoch());
  }
  ASSERT_EQ(name_of_address.size(), static_cast<size_t>(kWorkers));
  for (int restart = 1; restart <= 20; ++restart) {
    SCOPED_TRACE(absl::StrCat("restart ", restart));
    const absl::Status restarted = (*cluster)->RestartCoordinator();
    ASSERT_TRUE(restarted.ok()) << restarted;
    const absl::Status healthy =
        (*cluster)->WaitHealthy(kWorkers, absl::Seconds(60));
    ASSERT_TRUE(healthy.ok()) << healthy;
    const v1::GetClusterStatusResponse status = status_now();
    ASSERT_EQ(status.workers_size(), kWorkers);
    std::set<std::string> seen;
    uint64_t min_epoch = UINT64_MAX, max_epoch = 0;
    for (const v1::WorkerStatus& w : status.workers()) {
      EXPECT_TRUE(seen.insert(w.worker().address()).second)
          << w.worker().address() << " registered twice";
      EXPECT_EQ(w.worker().worker_id(), name_of_address[w.worker().address()]);
      min_epoch = std::min(min_epoch, w.epoch());
      max_epoch = std::max(max_epoch, w.epoch());
    }
    EXPECT_GT(min_epoch, last_max_epoch) << "an epoch was handed out again";
    last_max_epoch = max_epoch;
    const StreamResult result =
        RunGenerate((*cluster)->baton(), LongRequest(0, 4));
    EXPECT_TRUE(result.status.ok()) << Describe(result);
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

// A coordinator SIGTERMed while a stream is under way (its decode worker
// stopped at its third decode step, so the stream is mid-answer): health
// NOT_SERVING at once and new requests refused (UNAVAILABLE) while the
// stream goes on; with a drain timeout longer than the request, the stream
// ends with every token of a fault-free run and the coordinator exits 0;
// with a drain timeout shorter than the wait, it ends at the timeout with
// the tokens streamed so far and finish_reason CANCELLED (`abort` on HTTP),
// not an error, and the coordinator exits 0 all the same. No block stays
// held on the workers (they free a gone coordinator's leases).
class ClusterCoordinatorDrainTest : public ::testing::TestWithParam<bool> {};

TEST_P(ClusterCoordinatorDrainTest, StreamsFinishOrEndCancelled) {
  const bool finishes = GetParam();
  LocalClusterOptions options;
  options.coordinator_drain_timeout_s = finishes ? 3600 : 1;
  // The stopped decode worker sends no heartbeat: a lease longer than any
  // test keeps the coordinator from taking it for dead meanwhile.
  options.lease_ttl_ms = 3600 * 1000;
  options.flags_of_worker[1] = {"--fault=decode_step:stop@3"};
  auto cluster = StartOrDie(options);
  ASSERT_NE(cluster, nullptr);
  ASSERT_EQ(cluster->workers()[1].role, "decode");
  const v1::GenerateRequest request = LongRequest(3, 16);  // seeded
  const std::vector<Expected> expected = InProcessReference({request});

  StreamResult under_way;
  std::thread client(
      [&] { under_way = RunGenerate(cluster->baton(), request); });
  const absl::StatusOr<int> stopped = cluster->WaitForStoppedWorker(Guard());
  ChildProcess& coordinator = cluster->coordinator_process();
  if (stopped.ok()) coordinator.Signal(SIGTERM);
  if (stopped.ok() && finishes) {
    EXPECT_TRUE(Eventually([&] {
      return OwnHealth(cluster->address()) ==
             grpc::health::v1::HealthCheckResponse::NOT_SERVING;
    })) << "the draining coordinator's health stayed SERVING";
    const StreamResult refused = RunGenerate(cluster->baton(), request);
    EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE)
        << Describe(refused);
  } else if (stopped.ok()) {
    // Past the drain timeout before the worker goes on.
    ExpectExitsZero(coordinator);
  }
  cluster->workers()[1].process->Signal(SIGCONT);
  client.join();
  ASSERT_TRUE(stopped.ok()) << stopped.status() << "; " << Describe(under_way);
  ASSERT_TRUE(under_way.status.ok() && under_way.has_result)
      << Describe(under_way);
  if (finishes) {
    EXPECT_EQ(under_way.result.finish_reason(), expected[0].finish_reason);
    EXPECT_EQ(under_way.tokens, expected[0].tokens);
    EXPECT_EQ(under_way.text, expected[0].text);
    ExpectExitsZero(coordinator);
  } else {
    EXPECT_EQ(under_way.result.finish_reason(), v1::FINISH_REASON_CANCELLED)
        << Describe(under_way);
    ASSERT_GE(under_way.tokens.size(), 1u);
    EXPECT_LT(under_way.tokens.size(), expected[0].tokens.size());
    EXPECT_EQ(under_way.tokens,
              std::vector<int32_t>(
                  expected[0].tokens.begin(),
                  expected[0].tokens.begin() +
                      static_cast<ptrdiff_t>(under_way.tokens.size())));
  }
  ExpectAllFree(*cluster);
  ExpectCleanStop(*cluster);
}

INSTANTIATE_TEST_SUITE_P(Sigterm, ClusterCoordinatorDrainTest,
                         ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "DrainLongerThanTheStream"
                                             : "DrainTimesOut";
                         });

}  // namespace
}  // namespace baton::testing
