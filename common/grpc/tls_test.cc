// TLS and mutual TLS on a real server on loopback, with throw-away CAs made
// at run time: what a plaintext, wrong-CA, expired or certificate-less peer
// gets, and a rotated certificate picked up without a restart.
#include "common/grpc/tls.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc/serving.h"
#include "common/testing/test_pki.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::baton::testing::PemPair;
using ::baton::testing::TestCa;
using ::baton::testing::WriteFileAtomically;

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = baton::testing::TempDir::Create("baton-tls-test");
    ASSERT_TRUE(dir.ok()) << dir.status();
    temp_dir_ = std::move(*dir);
    dir_ = temp_dir_.path();
    auto a = TestCa::Create("cluster CA");
    auto b = TestCa::Create("other CA");
    ASSERT_TRUE(a.ok() && b.ok());
    ca_ = std::move(*a);
    other_ca_ = std::move(*b);
    ca_file_ = Write("ca.pem", ca_->cert_pem());
    other_ca_file_ = Write("other-ca.pem", other_ca_->cert_pem());
  }
  std::string Write(const std::string& name, const std::string& contents) {
    const std::string path = absl::StrCat(dir_, "/", name);
    EXPECT_TRUE(WriteFileAtomically(path, contents).ok());
    return path;
  }
  // Files of a fresh certificate from `ca`, named `name`.crt / .key.
  TlsFiles Identity(const TestCa& ca, const std::string& name,
                    absl::Duration not_before = absl::Hours(-1),
                    absl::Duration not_after = absl::Hours(24)) {
    auto pair = ca.Issue(name, not_before, not_after);
    EXPECT_TRUE(pair.ok()) << pair.status();
    TlsFiles files;
    files.cert = Write(name + ".crt", pair->cert);
    files.key = Write(name + ".key", pair->key);
    return files;
  }

  void StartHealthServer(const TlsFiles& tls) {
    auto running = StartServer("127.0.0.1:0", {}, 4 << 20, tls);
    ASSERT_TRUE(running.ok()) << running.status();
    server_ = std::move(*running);
  }

  // A health check over a fresh channel with `client` credentials.
  grpc::Status Check(const TlsFiles& client) {
    auto credentials = MakeChannelCredentials(client);
    if (!credentials.ok()) {
      return grpc::Status(grpc::StatusCode::INTERNAL,
                          std::string(credentials.status().message()));
    }
    auto stub = grpc::health::v1::Health::NewStub(
        grpc::CreateChannel(server_.address, *credentials));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(30));
    grpc::health::v1::HealthCheckRequest request;
    grpc::health::v1::HealthCheckResponse response;
    return stub->Check(&context, request, &response);
  }

  baton::testing::TempDir temp_dir_;  // removed with the fixture
  std::string dir_;
  std::unique_ptr<TestCa> ca_, other_ca_;
  std::string ca_file_, other_ca_file_;
  RunningServer server_;
};

TEST_F(TlsTest, TlsServerRefusesPlaintextAndAnswersItsCaClients) {
  StartHealthServer(Identity(*ca_, "server"));
  EXPECT_EQ(Check(TlsFiles{}).error_code(), grpc::StatusCode::UNAVAILABLE);
  TlsFiles trusting;
  trusting.ca = ca_file_;
  EXPECT_TRUE(Check(trusting).ok());
  // A client that trusts another CA does not talk to this server.
  trusting.ca = other_ca_file_;
  EXPECT_EQ(Check(trusting).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, MutualTlsRefusesMissingWrongCaAndExpiredClientCertificates) {
  TlsFiles server = Identity(*ca_, "server");
  server.ca = ca_file_;
  StartHealthServer(server);

  TlsFiles client = Identity(*ca_, "worker");
  client.ca = ca_file_;
  EXPECT_TRUE(Check(client).ok());

  TlsFiles no_certificate;
  no_certificate.ca = ca_file_;
  EXPECT_EQ(Check(no_certificate).error_code(), grpc::StatusCode::UNAVAILABLE);

  TlsFiles rogue = Identity(*other_ca_, "rogue");
  rogue.ca = ca_file_;
  EXPECT_EQ(Check(rogue).error_code(), grpc::StatusCode::UNAVAILABLE);

  // Expired: CheckTlsFiles refuses it up front, and a client that skips the
  // check (written directly against gRPC) is refused by the handshake.
  TlsFiles expired =
      Identity(*ca_, "expired", absl::Hours(-48), absl::Hours(-24));
  expired.ca = ca_file_;
  const absl::Status check = CheckTlsFiles(expired, false, "--tls");
  EXPECT_EQ(check.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(check.message().find("expired"), std::string::npos) << check;
  namespace gx = grpc::experimental;
  gx::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(
      std::make_shared<gx::FileWatcherCertificateProvider>(
          expired.key, expired.cert, expired.ca, 1));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(server_.address, gx::TlsCredentials(options)));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(30));
  grpc::health::v1::HealthCheckResponse response;
  EXPECT_EQ(stub->Check(&context, {}, &response).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, RotatedServerCertificateIsPickedUpWithoutARestart) {
  TlsFiles server = Identity(*ca_, "server");
  server.reload_interval = absl::Seconds(1);
  StartHealthServer(server);
  TlsFiles old_trust, new_trust;
  old_trust.ca = ca_file_;
  new_trust.ca = other_ca_file_;
  ASSERT_TRUE(Check(old_trust).ok());
  ASSERT_FALSE(Check(new_trust).ok());

  // Rotate to a certificate from the other CA: key first would leave a
  // window where the pair does not match; gRPC's watcher keeps the old
  // pair until both files read as a matching pair.
  auto rotated = other_ca_->Issue("server");
  ASSERT_TRUE(rotated.ok());
  ASSERT_TRUE(WriteFileAtomically(server.key, rotated->key).ok());
  ASSERT_TRUE(WriteFileAtomically(server.cert, rotated->cert).ok());
  // The watcher re-reads every second; a slow host may take a few periods.
  bool picked_up = false;
  for (int i = 0; i < 600 && !picked_up; ++i) {
    picked_up = Check(new_trust).ok();
    if (!picked_up) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(picked_up);
  EXPECT_EQ(Check(old_trust).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, CheckTlsFilesNamesTheFlagAndTheProblem) {
  TlsFiles a = Identity(*ca_, "a");
  TlsFiles b = Identity(*ca_, "b");
  TlsFiles mismatched{a.cert, b.key, ca_file_};
  absl::Status s = CheckTlsFiles(mismatched, true, "--control_tls");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--control_tls_key"), std::string::npos) << s;
  EXPECT_NE(s.message().find("not the private key"), std::string::npos) << s;

  TlsFiles cert_only{a.cert, "", ""};
  s = CheckTlsFiles(cert_only, true, "--tls");
  EXPECT_NE(s.message().find("go together"), std::string::npos) << s;

  TlsFiles missing{dir_ + "/nope.crt", a.key, ""};
  s = CheckTlsFiles(missing, true, "--tls");
  EXPECT_NE(s.message().find("cannot read"), std::string::npos) << s;

  TlsFiles not_pem{a.key, a.key, ""};
  s = CheckTlsFiles(not_pem, true, "--tls");
  EXPECT_NE(s.message().find("no PEM certificate"), std::string::npos) << s;

  TlsFiles client_without_ca{a.cert, a.key, ""};
  s = CheckTlsFiles(client_without_ca, false, "--tls");
  EXPECT_NE(s.message().find("--tls_ca"), std::string::npos) << s;

  auto refused =
      StartServer("127.0.0.1:0", {}, 4 << 20, mismatched, "--control_tls");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckTlsFiles(TlsFiles{}, true, "--tls").ok());
}

TEST(IsLoopbackHostTest, LoopbackNamesAndAddresses) {
  for (const char* host :
       {"localhost", "127.0.0.1", "127.1.2.3", "::1", "[::1]", "LOCALHOST"}) {
    EXPECT_TRUE(IsLoopbackHost(host)) << host;
  }
  for (const char* host : {"0.0.0.0", "[::]", "10.0.0.1", "example.com", ""}) {
    EXPECT_FALSE(IsLoopbackHost(host)) << host;
  }
}

}  // namespace
}  // namespace baton
