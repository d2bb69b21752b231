// Keepalive between a client and a server set up by common/grpc/keepalive:
// a client that pings as often as the server allows keeps its connection
// through a quiet stream (no GOAWAY "too_many_pings"), and one that pings
// more often loses it, so the check can fail. The intervals are scaled down
// from the defaults, whose relation the first test checks.
#include "common/grpc/keepalive.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

struct Server {
  // A server needs one service of its own besides the default health
  // service; this one answers UNIMPLEMENTED to everything.
  std::unique_ptr<grpc::CallbackGenericService> generic =
      std::make_unique<grpc::CallbackGenericService>();
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

Server StartHealthOnly(const KeepaliveOptions& options) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  SetServerKeepalive(&builder, options);
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  Server out;
  builder.RegisterCallbackGenericService(out.generic.get());
  out.server = builder.BuildAndStart();
  out.address = absl::StrCat("127.0.0.1:", port);
  return out;
}

// Whether the client's connection to `address` left READY within
// `window` while a health Watch stream (answered once, then quiet) was
// open on it: a server that counts the client's keepalive pings as abuse
// sends GOAWAY "too_many_pings", which takes the connection out of READY.
bool ConnectionLostWhileQuiet(const std::string& address,
                              const KeepaliveOptions& client,
                              absl::Duration window) {
  grpc::ChannelArguments args;
  SetClientKeepalive(&args, client);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), args);
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckRequest request;
  auto reader = stub->Watch(&context, request);
  grpc::health::v1::HealthCheckResponse response;
  EXPECT_TRUE(reader->Read(&response));  // the current status, at once
  EXPECT_EQ(channel->GetState(false), GRPC_CHANNEL_READY);
  const bool lost = channel->WaitForStateChange(
      GRPC_CHANNEL_READY, absl::ToChronoTime(absl::Now() + window));
  context.TryCancel();
  while (reader->Read(&response)) {
  }
  reader->Finish();
  return lost;
}

TEST(KeepaliveTest, DefaultClientsPingNoMoreOftenThanDefaultServersAllow) {
  const KeepaliveOptions defaults;
  EXPECT_GE(defaults.client_time, defaults.server_min_ping_interval);
  EXPECT_GT(defaults.client_timeout, absl::ZeroDuration());
}

// gRPC sends a client's pings at most once a second, whatever the
// keepalive time, so the scaled intervals stay at or above that.
KeepaliveOptions Scaled(absl::Duration client_time,
                        absl::Duration server_min_ping_interval) {
  KeepaliveOptions options;
  options.client_time = client_time;
  options.client_timeout = absl::Seconds(5);
  options.server_min_ping_interval = server_min_ping_interval;
  return options;
}

// Pings 1.2 s apart where the server allows 1 s: about 5 pings in 6 s, all
// accepted.
TEST(KeepaliveTest, ClientsPingingAsAllowedKeepTheirConnection) {
  const KeepaliveOptions options =
      Scaled(absl::Milliseconds(1200), absl::Seconds(1));
  Server server = StartHealthOnly(options);
  ASSERT_NE(server.server, nullptr);
  EXPECT_FALSE(
      ConnectionLostWhileQuiet(server.address, options, absl::Seconds(6)));
  server.server->Shutdown(absl::ToChronoTime(absl::Now()));
}

// Pings 1 s apart where the server allows 5 s: the server sends GOAWAY
// (too_many_pings) after its strikes, and the check above fails.
TEST(KeepaliveTest, ClientsPingingTooOftenLoseTheirConnection) {
  const KeepaliveOptions options = Scaled(absl::Seconds(1), absl::Seconds(5));
  Server server = StartHealthOnly(options);
  ASSERT_NE(server.server, nullptr);
  EXPECT_TRUE(
      ConnectionLostWhileQuiet(server.address, options, absl::Seconds(30)));
  server.server->Shutdown(absl::ToChronoTime(absl::Now()));
}

}  // namespace
}  // namespace baton
