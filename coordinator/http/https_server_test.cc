// HttpServer over TLS (HttpServerOptions::tls), checked with curl against
// throw-away CAs made at run time: the same requests and streams as over
// plaintext, plaintext refused, a client certificate required with a CA,
// and rotated certificate files used for new connections.
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/test_util.h"
#include "common/testing/test_pki.h"
#include "coordinator/http/http_server.h"
#include "gtest/gtest.h"

namespace baton::http {
namespace {

using ::baton::testing::RunCommand;
using ::baton::testing::TestCa;
using ::baton::testing::WriteFileAtomically;

class HttpsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = baton::testing::TempDir::Create("baton-https-test");
    ASSERT_TRUE(dir.ok());
    temp_dir_ = std::move(*dir);
    dir_ = temp_dir_.path();
    auto ca = TestCa::Create("cluster CA");
    auto other = TestCa::Create("other CA");
    ASSERT_TRUE(ca.ok() && other.ok());
    ca_ = std::move(*ca);
    other_ca_ = std::move(*other);
    Write("ca.pem", ca_->cert_pem());
    Write("other-ca.pem", other_ca_->cert_pem());
    Issue(*ca_, "server");
    Issue(*ca_, "client");
  }
  void TearDown() override {
    server_.reset();
    for (std::thread& t : threads_) t.join();
  }

  std::string File(const std::string& name) const {
    return absl::StrCat(dir_, "/", name);
  }
  void Write(const std::string& name, const std::string& contents) {
    ASSERT_TRUE(WriteFileAtomically(File(name), contents).ok());
  }
  void Issue(const TestCa& ca, const std::string& name) {
    auto pair = ca.Issue(name);
    ASSERT_TRUE(pair.ok()) << pair.status();
    Write(name + ".crt", pair->cert);
    Write(name + ".key", pair->key);
  }

  void Start(bool mutual) {
    HttpServerOptions options;
    options.listen = "127.0.0.1:0";
    options.tls.cert = File("server.crt");
    options.tls.key = File("server.key");
    if (mutual) options.tls.ca = File("ca.pem");
    options.tls.reload_interval = absl::Seconds(1);
    auto server = HttpServer::Start(
        options, [this](HttpRequest request, std::shared_ptr<HttpExchange> ex) {
          if (request.path == "/stream") {
            threads_.emplace_back([ex] {
              ex->StartStream(200, "text/event-stream");
              for (const char* part : {"a", "bb", "ccc"}) ex->Write(part);
              ex->EndStream();
            });
            return;
          }
          ex->Respond(200, "text/plain",
                      absl::StrCat(request.method, " ", request.body));
        });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  // curl's output (body, then the status code), or its error.
  std::string Curl(const std::string& args, const std::string& path) {
    auto out =
        RunCommand(absl::StrCat("curl -sS --max-time 60 -w ' %{http_code}' ",
                                args, " ", path, " 2>&1"));
    return out.ok() ? *out : absl::StrCat("failed: ", out.status().message());
  }
  std::string Https(const std::string& path) const {
    return absl::StrCat("https://", server_->address(), path);
  }

  baton::testing::TempDir temp_dir_;  // removed with the fixture
  std::string dir_;
  std::unique_ptr<TestCa> ca_, other_ca_;
  std::unique_ptr<HttpServer> server_;
  std::vector<std::thread> threads_;
};

TEST_F(HttpsServerTest, ServesRequestsAndStreamsOverTlsOnly) {
  Start(/*mutual=*/false);
  const std::string trust = "--cacert " + File("ca.pem");
  EXPECT_EQ(Curl(trust + " -d hello", Https("/echo")), "POST hello 200");
  EXPECT_EQ(Curl(trust, Https("/stream")), "abbccc 200");
  // Plaintext on the TLS port, and a client that trusts another CA, get
  // no response.
  EXPECT_NE(Curl("", absl::StrCat("http://", server_->address(), "/echo"))
                .find("failed"),
            std::string::npos);
  EXPECT_NE(
      Curl("--cacert " + File("other-ca.pem"), Https("/echo")).find("failed"),
      std::string::npos);
}

TEST_F(HttpsServerTest, MutualTlsRequiresAClientCertificateFromTheCa) {
  Start(/*mutual=*/true);
  const std::string trust = "--cacert " + File("ca.pem");
  EXPECT_NE(Curl(trust, Https("/echo")).find("failed"), std::string::npos);
  Issue(*other_ca_, "rogue");
  EXPECT_NE(Curl(absl::StrCat(trust, " --cert ", File("rogue.crt"), " --key ",
                              File("rogue.key")),
                 Https("/echo"))
                .find("failed"),
            std::string::npos);
  EXPECT_EQ(Curl(absl::StrCat(trust, " --cert ", File("client.crt"), " --key ",
                              File("client.key")),
                 Https("/echo")),
            "GET  200");
}

TEST_F(HttpsServerTest, RotatedCertificateServesNewConnections) {
  Start(/*mutual=*/false);
  const std::string new_trust = "--cacert " + File("other-ca.pem");
  ASSERT_NE(Curl(new_trust, Https("/echo")).find("failed"), std::string::npos);
  auto rotated = other_ca_->Issue("server");
  ASSERT_TRUE(rotated.ok());
  Write("server.key", rotated->key);
  Write("server.crt", rotated->cert);
  // The files are looked at once a second, at a new connection.
  std::string out;
  for (int i = 0; i < 600; ++i) {
    out = Curl(new_trust, Https("/echo"));
    if (out == "GET  200") break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(out, "GET  200");
  EXPECT_NE(Curl("--cacert " + File("ca.pem"), Https("/echo")).find("failed"),
            std::string::npos);
}

}  // namespace
}  // namespace baton::http
