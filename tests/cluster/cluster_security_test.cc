// A cluster with every plane secured, as docs/security.md describes: TLS on
// the public gRPC port and HTTPS on the HTTP API, mutual TLS on the control
// plane (coordinator and workers, with a throw-away CA made at run time), and
// API keys on the public gRPC and HTTP APIs. Real processes on loopback. Each
// rogue peer of the threat model is refused with the status it should get, and
// a rotated API key file is picked up without a restart.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/auth/bearer_interceptor.h"
#include "common/grpc/tls.h"
#include "common/test_util.h"
#include "common/testing/test_pki.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/cluster/cluster_test_util.h"
#include "tests/cluster/local_cluster.h"

namespace baton::testing {
namespace {

constexpr char kKey[] = "sk-baton-test-one";
constexpr char kRotatedKey[] = "sk-baton-test-two";

class ClusterSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = TempDir::Create("baton-security-test");
    ASSERT_TRUE(dir.ok()) << dir.status();
    temp_dir_ = std::move(*dir);
    dir_ = temp_dir_.path();
    auto ca = TestCa::Create("cluster CA");
    auto rogue_ca = TestCa::Create("rogue CA");
    ASSERT_TRUE(ca.ok() && rogue_ca.ok());
    ca_ = Write("ca.pem", (*ca)->cert_pem());
    for (const char* name : {"public", "coordinator", "worker", "operator"}) {
      Issue(**ca, name);
    }
    Issue(**rogue_ca, "rogue");
    keys_ = Write("api-keys", absl::StrCat("# test keys\n", kKey, "\n"));
  }
  std::string Write(const std::string& name, const std::string& contents) {
    const std::string path = absl::StrCat(dir_, "/", name);
    EXPECT_TRUE(WriteFileAtomically(path, contents).ok());
    return path;
  }
  void Issue(const TestCa& ca, const std::string& name) {
    auto pair = ca.Issue(name);
    ASSERT_TRUE(pair.ok()) << pair.status();
    Write(name + ".crt", pair->cert);
    Write(name + ".key", pair->key);
  }
  std::string File(const std::string& name) const {
    return absl::StrCat(dir_, "/", name);
  }
  // Client-side files: `name`'s certificate (none for "") and the CA.
  TlsFiles Client(const std::string& name, const std::string& ca) const {
    TlsFiles files;
    if (!name.empty()) {
      files.cert = File(name + ".crt");
      files.key = File(name + ".key");
    }
    files.ca = ca;
    return files;
  }

  LocalClusterOptions SecuredOptions() const {
    LocalClusterOptions options;
    options.http = true;
    options.coordinator_flags = {
        "--tls_cert=" + File("public.crt"),
        "--tls_key=" + File("public.key"),
        "--control_tls_cert=" + File("coordinator.crt"),
        "--control_tls_key=" + File("coordinator.key"),
        "--control_tls_ca=" + ca_,
        "--api_keys_file=" + keys_,
        "--health_listen=127.0.0.1:0"};
    options.worker_flags = {
        "--tls_cert=" + File("worker.crt"), "--tls_key=" + File("worker.key"),
        "--tls_ca=" + ca_, "--kv_tls", "--health_listen=127.0.0.1:0"};
    options.public_client_tls = Client("", ca_);
    options.control_client_tls = Client("operator", ca_);
    options.api_key = kKey;
    return options;
  }

  baton::testing::TempDir temp_dir_;  // removed with the fixture
  std::string dir_, ca_, keys_;
};

std::shared_ptr<grpc::ChannelCredentials> Credentials(const TlsFiles& files) {
  auto credentials = MakeChannelCredentials(files);
  EXPECT_TRUE(credentials.ok()) << credentials.status();
  return credentials.ok() ? *credentials : grpc::InsecureChannelCredentials();
}

std::unique_ptr<grpc::ClientContext> Context() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(30));
  return context;
}

grpc::StatusCode ClusterStatusCode(const std::string& address,
                                   const TlsFiles& tls,
                                   const std::string& key) {
  auto stub =
      v1::Baton::NewStub(CreateChannelWithKey(address, Credentials(tls), key));
  v1::GetClusterStatusResponse response;
  return stub->GetClusterStatus(Context().get(), {}, &response).error_code();
}

// What a control-plane peer with `tls` gets from the coordinator
// (RegisterWorker, the rogue worker's first call) and from a worker
// (GetWorkerStatus, which lists requests, and Cancel).
struct ControlCodes {
  grpc::StatusCode register_worker;
  grpc::StatusCode worker_status;
  grpc::StatusCode cancel;
};
// A plaintext health port (--health_listen) answers grpc.health.v1 and
// nothing else.
void ExpectHealthOnly(ChildProcess& process, const std::string& marker) {
  const absl::StatusOr<std::string> line =
      process.WaitForLine(marker, absl::Seconds(30));
  ASSERT_TRUE(line.ok()) << line.status();
  const std::string address = line->substr(marker.size());
  auto channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::health::v1::HealthCheckResponse health;
  auto health_context = Context();
  const grpc::Status checked =
      grpc::health::v1::Health::NewStub(channel)->Check(health_context.get(),
                                                        {}, &health);
  ASSERT_TRUE(checked.ok()) << address << ": " << checked.error_message();
  EXPECT_EQ(health.status(), grpc::health::v1::HealthCheckResponse::SERVING)
      << address;
  v1::GetWorkerStatusResponse status;
  auto worker_context = Context();
  EXPECT_EQ(v1::Worker::NewStub(channel)
                ->GetWorkerStatus(worker_context.get(), {}, &status)
                .error_code(),
            grpc::StatusCode::UNIMPLEMENTED)
      << address;
  v1::GetClusterStatusResponse cluster_status;
  auto api_context = Context();
  EXPECT_EQ(v1::Baton::NewStub(channel)
                ->GetClusterStatus(api_context.get(), {}, &cluster_status)
                .error_code(),
            grpc::StatusCode::UNIMPLEMENTED)
      << address;
}

ControlCodes ControlPlaneCodes(LocalCluster& cluster, const TlsFiles& tls) {
  ControlCodes codes;
  auto coordinator = v1::Coordinator::NewStub(
      grpc::CreateChannel(cluster.control_address(), Credentials(tls)));
  v1::RegisterWorkerRequest request;
  request.set_role(v1::WORKER_ROLE_DECODE);
  request.set_address("127.0.0.1:1");
  request.set_worker_id("rogue");
  v1::RegisterWorkerResponse registered;
  codes.register_worker =
      coordinator->RegisterWorker(Context().get(), request, &registered)
          .error_code();
  auto worker = v1::Worker::NewStub(
      grpc::CreateChannel(cluster.workers()[0].address, Credentials(tls)));
  v1::GetWorkerStatusResponse status;
  codes.worker_status =
      worker->GetWorkerStatus(Context().get(), {}, &status).error_code();
  v1::CancelRequest cancel;
  cancel.set_request_id("someone-elses-request");
  v1::CancelResponse cancelled;
  codes.cancel =
      worker->Cancel(Context().get(), cancel, &cancelled).error_code();
  return codes;
}

// The HTTP status of GET `url` with `key` ("": no Authorization header),
// trusting `ca` for HTTPS.
std::string HttpStatus(const std::string& url, const std::string& ca,
                       const std::string& key) {
  std::string command = absl::StrCat(
      "curl -sS --max-time 60 -o /dev/null -w '%{http_code}' --cacert ", ca,
      " ");
  if (!key.empty()) {
    absl::StrAppend(&command, "-H 'Authorization: Bearer ", key, "' ");
  }
  absl::StrAppend(&command, url);
  auto out = RunCommand(command);
  return out.ok() ? *out : std::string(out.status().message());
}

TEST_F(ClusterSecurityTest, EveryPlaneRefusesUnauthenticatedPeers) {
  // Start waits until both workers registered over mutual TLS and
  // GetClusterStatus (TLS, with the key) lists them healthy.
  auto cluster = LocalCluster::Start(SecuredOptions());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;

  // An authenticated client is served, across the P/D split (the prefill
  // worker hands KV to the decode worker it reached over mutual TLS, on a
  // KV connection that is mutual TLS as well: --kv_tls).
  const StreamResult served = RunGenerate(
      c.baton(), ChatRequest("What is the capital of France?", 4, 0.0, 7));
  ASSERT_TRUE(served.status.ok()) << Describe(served);
  EXPECT_FALSE(served.tokens.empty()) << Describe(served);

  // Public plane: no key or a wrong key is UNAUTHENTICATED, on every RPC;
  // plaintext does not get through the TLS port at all.
  const TlsFiles public_tls = Client("", ca_);
  EXPECT_EQ(ClusterStatusCode(c.address(), public_tls, ""),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(ClusterStatusCode(c.address(), public_tls, "sk-guess"),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(ClusterStatusCode(c.address(), TlsFiles{}, kKey),
            grpc::StatusCode::UNAVAILABLE);
  {
    auto stub = v1::Baton::NewStub(
        CreateChannelWithKey(c.address(), Credentials(public_tls), "sk-guess"));
    const StreamResult refused =
        RunGenerate(*stub, ChatRequest("hello", 4, 0.0, 7));
    EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << Describe(refused);
    EXPECT_TRUE(refused.tokens.empty());
  }

  // Control plane (coordinator and workers): a rogue worker with no
  // certificate, one from another CA, or plaintext cannot register,
  // list requests or cancel them; a peer with a cluster certificate can.
  for (const TlsFiles& rogue :
       {TlsFiles{}, Client("", ca_), Client("rogue", ca_)}) {
    const ControlCodes codes = ControlPlaneCodes(c, rogue);
    EXPECT_EQ(codes.register_worker, grpc::StatusCode::UNAVAILABLE)
        << rogue.cert;
    EXPECT_EQ(codes.worker_status, grpc::StatusCode::UNAVAILABLE) << rogue.cert;
    EXPECT_EQ(codes.cancel, grpc::StatusCode::UNAVAILABLE) << rogue.cert;
  }
  const ControlCodes trusted = ControlPlaneCodes(c, Client("operator", ca_));
  EXPECT_EQ(trusted.worker_status, grpc::StatusCode::OK);
  EXPECT_EQ(trusted.cancel, grpc::StatusCode::OK);

  // HTTP (HTTPS with the public certificate): the API needs the key (401
  // otherwise); /health and /metrics are open by default; plaintext gets
  // no answer.
  const std::string https = "https://" + c.http_address();
  EXPECT_EQ(HttpStatus(https + "/v1/models", ca_, ""), "401");
  EXPECT_EQ(HttpStatus(https + "/v1/models", ca_, "sk-guess"), "401");
  EXPECT_EQ(HttpStatus(https + "/v1/models", ca_, kKey), "200");
  EXPECT_EQ(HttpStatus(https + "/health", ca_, ""), "200");
  EXPECT_EQ(HttpStatus(https + "/metrics", ca_, ""), "200");

  // Probes that speak no TLS (Kubernetes') ask the plaintext health ports,
  // which tell nothing else.
  ExpectHealthOnly(c.coordinator_process(), "baton-coordinator health on ");
  for (LocalCluster::Worker& w : c.workers()) {
    ExpectHealthOnly(*w.process, "baton-worker health on ");
  }
  EXPECT_NE(HttpStatus("http://" + c.http_address() + "/v1/models", ca_, kKey),
            "200");

  // Rotating the key file: the new key works and the old one stops working,
  // without a restart (the file is looked at once a second).
  ASSERT_TRUE(WriteFileAtomically(keys_, absl::StrCat(kRotatedKey, "\n")).ok());
  bool rotated = false;
  for (int i = 0; i < 600 && !rotated; ++i) {
    rotated = ClusterStatusCode(c.address(), public_tls, kRotatedKey) ==
              grpc::StatusCode::OK;
    if (!rotated) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(rotated);
  EXPECT_EQ(ClusterStatusCode(c.address(), public_tls, kKey),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(HttpStatus(https + "/v1/models", ca_, kRotatedKey), "200");
  EXPECT_EQ(HttpStatus(https + "/v1/models", ca_, kKey), "401");

  const absl::Status stopped = c.Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

// A coordinator or worker given half a TLS configuration, or files that do
// not fit together, refuses to start with a message naming the flag.
TEST_F(ClusterSecurityTest, IncompleteOrMismatchedTlsFlagsAreStartErrors) {
  const std::string model = DefaultModelPath();
  const std::string coordinator = BinaryDir() + "/baton-coordinator";
  const std::string worker = BinaryDir() + "/baton-worker";
  struct Case {
    std::string command;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {absl::StrCat(coordinator, " --model=", model,
                    " --listen=127.0.0.1:0 --control_listen=127.0.0.1:0",
                    " --control_tls_cert=", File("coordinator.crt"),
                    " --control_tls_key=", File("coordinator.key")),
       "--control_tls_ca"},
      {absl::StrCat(coordinator, " --model=", model,
                    " --listen=127.0.0.1:0 --control_listen=127.0.0.1:0",
                    " --tls_cert=", File("public.crt"),
                    " --tls_key=", File("worker.key")),
       "--tls_key"},
      {absl::StrCat(coordinator, " --model=", model,
                    " --listen=127.0.0.1:0 --control_listen=127.0.0.1:0",
                    " --api_keys_file=", File("no-such-file")),
       "--api_keys_file"},
      {absl::StrCat(worker, " --model=", model, " --listen=127.0.0.1:0",
                    " --tls_cert=", File("worker.crt"),
                    " --tls_key=", File("worker.key")),
       "--tls_ca"},
      {absl::StrCat(worker, " --model=", model, " --listen=127.0.0.1:0",
                    " --kv_tls"),
       "--kv_tls needs --tls_cert"},
  };
  for (const Case& test : cases) {
    auto out = RunCommand(absl::StrCat(test.command, " 2>&1; echo exit=$?"));
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_NE(out->find("exit=2"), std::string::npos) << *out;
    EXPECT_NE(out->find(test.expected), std::string::npos) << *out;
  }
}

}  // namespace
}  // namespace baton::testing
