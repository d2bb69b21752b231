#include "coordinator/http/http_server.h"

#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = boost::asio::ip::tcp;
using ::testing::HasSubstr;

// Routes: /echo answers the body; /stream sends "a", "bb", "ccc" as chunks
// from another thread; /big streams 64 chunks of 1 MiB; /hold streams one
// chunk and then nothing until the client leaves; /keep streams one chunk
// and hands its exchange to the test.
class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HttpServerOptions options;
    options.listen = "127.0.0.1:0";
    options.max_body_bytes = 1000;
    auto server = HttpServer::Start(
        options, [this](HttpRequest request, std::shared_ptr<HttpExchange> ex) {
          Handle(std::move(request), std::move(ex));
        });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    const std::string& address = server_->address();
    ASSERT_TRUE(
        absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port_));
    ASSERT_GT(port_, 0);
  }
  void TearDown() override {
    server_.reset();
    for (std::thread& t : workers_) t.join();
  }

  void Handle(HttpRequest request, std::shared_ptr<HttpExchange> ex) {
    if (request.path == "/echo") {
      ex->Respond(200, "text/plain",
                  absl::StrCat(request.method, " ", request.body));
    } else if (request.path == "/stream") {
      workers_.emplace_back([ex] {
        ex->StartStream(200, "text/event-stream");
        for (const char* part : {"a", "bb", "ccc"}) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
          ex->Write(part);
        }
        ex->EndStream();
      });
    } else if (request.path == "/big") {
      ex->StartStream(200, "application/octet-stream");
      for (int i = 0; i < 64; ++i) ex->Write(std::string(1 << 20, 'x'));
      ex->EndStream();
    } else if (request.path == "/keep") {
      ex->StartStream(200, "text/event-stream");
      ex->Write("data: first\n\n");
      kept_ = std::move(ex);
      kept_ready_.Notify();
    } else if (request.path == "/hold") {
      ex->SetOnDisconnect([this] { disconnected_.Notify(); });
      ex->StartStream(200, "text/event-stream");
      ex->Write("data: first\n\n");
    } else {
      ex->Respond(404, "text/plain", "none");
    }
  }

  tcp::socket Connect() {
    tcp::socket socket(io_);
    socket.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"),
                                 static_cast<uint16_t>(port_)));
    return socket;
  }

  bhttp::response<bhttp::string_body> Exchange(tcp::socket& socket,
                                               bhttp::verb verb,
                                               const std::string& target,
                                               const std::string& body = "") {
    bhttp::request<bhttp::string_body> req{verb, target, 11};
    req.set(bhttp::field::host, "localhost");
    req.body() = body;
    req.prepare_payload();
    bhttp::write(socket, req);
    bhttp::response<bhttp::string_body> res;
    bhttp::read(socket, buffer_, res);
    return res;
  }

  // Sends GET `target` and reads only the response's status line and
  // headers (a stream that the handler keeps open); returns the status.
  unsigned StartStream(tcp::socket& socket, const std::string& target) {
    bhttp::request<bhttp::empty_body> req{bhttp::verb::get, target, 11};
    bhttp::write(socket, req);
    bhttp::response_parser<bhttp::string_body> parser;
    bhttp::read_header(socket, buffer_, parser);
    return parser.get().result_int();
  }

  asio::io_context io_;
  beast::flat_buffer buffer_;
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
  std::vector<std::thread> workers_;
  absl::Notification disconnected_;
  std::shared_ptr<HttpExchange> kept_;
  absl::Notification kept_ready_;
};

TEST_F(HttpServerTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  tcp::socket socket = Connect();
  for (int i = 0; i < 3; ++i) {
    auto res = Exchange(socket, bhttp::verb::post, "/echo?x=1",
                        absl::StrCat("body", i));
    EXPECT_EQ(res.result_int(), 200u);
    EXPECT_EQ(res.body(), absl::StrCat("POST body", i));
    EXPECT_TRUE(res.keep_alive());
  }
  EXPECT_EQ(Exchange(socket, bhttp::verb::get, "/nope").result_int(), 404u);
}

// Requests written back to back before any answer: the second is already
// buffered when the first is answered and must still be parsed.
TEST_F(HttpServerTest, PipelinedRequestsAreAnsweredInOrder) {
  tcp::socket socket = Connect();
  std::string wire;
  for (int i = 0; i < 3; ++i) {
    bhttp::request<bhttp::string_body> req{bhttp::verb::post, "/echo", 11};
    req.set(bhttp::field::host, "localhost");
    req.body() = absl::StrCat("p", i);
    req.prepare_payload();
    std::ostringstream out;
    out << req;
    wire += out.str();
  }
  asio::write(socket, asio::buffer(wire));
  for (int i = 0; i < 3; ++i) {
    bhttp::response<bhttp::string_body> res;
    bhttp::read(socket, buffer_, res);
    EXPECT_EQ(res.body(), absl::StrCat("POST p", i));
  }
}

TEST_F(HttpServerTest, StreamsChunksThenServesTheNextRequest) {
  tcp::socket socket = Connect();
  auto res = Exchange(socket, bhttp::verb::get, "/stream");
  EXPECT_EQ(res.result_int(), 200u);
  EXPECT_TRUE(res.chunked());
  EXPECT_EQ(res[bhttp::field::content_type], "text/event-stream");
  EXPECT_EQ(res.body(), "abbccc");
  EXPECT_EQ(Exchange(socket, bhttp::verb::get, "/echo").body(), "GET ");
}

// A handler may hold an exchange past the server's end (a Generate call
// finishing on another thread): calling and releasing it then is harmless,
// also on another thread (ASan and TSan watch this).
TEST_F(HttpServerTest, AnExchangeMayOutliveTheServer) {
  tcp::socket socket = Connect();
  EXPECT_EQ(StartStream(socket, "/keep"), 200u);
  ASSERT_TRUE(kept_ready_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  std::shared_ptr<HttpExchange> exchange = std::move(kept_);
  std::thread writer([exchange] {
    for (int i = 0; i < 200; ++i) exchange->Write("data: more\n\n");
  });
  server_.reset();
  writer.join();
  exchange->EndStream();
  std::thread([exchange = std::move(exchange)]() mutable {
    exchange.reset();
  }).join();
}

TEST_F(HttpServerTest, BodyOverTheLimitIs413) {
  tcp::socket socket = Connect();
  auto res =
      Exchange(socket, bhttp::verb::post, "/echo", std::string(5000, 'x'));
  EXPECT_EQ(res.result_int(), 413u);
  EXPECT_THAT(res.body(), HasSubstr("request_too_large"));
  EXPECT_THAT(res.body(), HasSubstr("1000 bytes"));
  EXPECT_FALSE(res.keep_alive());
  // The server keeps serving others.
  tcp::socket again = Connect();
  EXPECT_EQ(Exchange(again, bhttp::verb::post, "/echo", "ok").body(),
            "POST ok");
}

TEST_F(HttpServerTest, AnswersExpect100Continue) {
  tcp::socket socket = Connect();
  asio::write(socket, asio::buffer(std::string(
                          "POST /echo HTTP/1.1\r\nHost: x\r\nExpect: "
                          "100-continue\r\nContent-Length: 5\r\nConnection: "
                          "close\r\n\r\n")));
  std::string in;
  asio::read_until(socket, asio::dynamic_buffer(in), "\r\n\r\n");
  EXPECT_EQ(in.rfind("HTTP/1.1 100 Continue\r\n\r\n", 0), 0u) << in;
  asio::write(socket, asio::buffer(std::string("hello")));
  beast::error_code ec;
  asio::read(socket, asio::dynamic_buffer(in), ec);  // to the close
  EXPECT_THAT(in, HasSubstr("HTTP/1.1 200 OK"));
  EXPECT_THAT(in, HasSubstr("\r\n\r\nPOST hello"));
}

TEST_F(HttpServerTest, MalformedRequestIs400) {
  tcp::socket socket = Connect();
  asio::write(socket, asio::buffer(std::string("NOT HTTP AT ALL\r\n\r\n")));
  bhttp::response<bhttp::string_body> res;
  bhttp::read(socket, buffer_, res);
  EXPECT_EQ(res.result_int(), 400u);
  EXPECT_THAT(res.body(), HasSubstr("malformed HTTP request"));
}

TEST_F(HttpServerTest, DisconnectMidStreamFiresTheCallback) {
  {
    tcp::socket socket = Connect();
    // Headers and the first chunk arrive, then the client leaves.
    EXPECT_EQ(StartStream(socket, "/hold"), 200u);
  }
  EXPECT_TRUE(disconnected_.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

TEST_F(HttpServerTest, SlowReaderDoesNotStallOthers) {
  // 64 MiB queued for a client that reads only its headers...
  tcp::socket slow = Connect();
  bhttp::request<bhttp::empty_body> req{bhttp::verb::get, "/big", 11};
  bhttp::write(slow, req);
  beast::flat_buffer slow_buffer;
  bhttp::response_parser<bhttp::string_body> parser;
  parser.body_limit(100u << 20);
  // The headers go out only after the handler has queued all 64 chunks.
  bhttp::read_header(slow, slow_buffer, parser);
  ASSERT_EQ(parser.get().result_int(), 200u);
  // ...while other clients are served, on every I/O thread. The slow
  // reader reads on only after this loop, so a server that made these wait
  // for its queue to drain hangs here.
  for (int i = 0; i < 20; ++i) {
    tcp::socket socket = Connect();
    EXPECT_EQ(Exchange(socket, bhttp::verb::post, "/echo", "x").body(),
              "POST x");
  }
  // The slow reader still gets every byte.
  bhttp::read(slow, slow_buffer, parser);
  EXPECT_EQ(parser.get().body().size(), size_t{64} << 20);
}

TEST(HttpServerStartTest, BadAddressesAreErrors) {
  HttpServerOptions options;
  options.listen = "no-port";
  auto bad = HttpServer::Start(options, [](HttpRequest, auto) {});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  options.listen = "127.0.0.1:0";
  auto first = HttpServer::Start(options, [](HttpRequest, auto) {});
  ASSERT_TRUE(first.ok());
  options.listen = (*first)->address();
  auto taken = HttpServer::Start(options, [](HttpRequest, auto) {});
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace baton::http
