#include "common/metrics/metrics_server.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"

namespace baton::metrics {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr std::chrono::seconds kIoTimeout(10);
constexpr uint32_t kMaxHeaderBytes = 16 * 1024;

// One connection: read one request, answer it, close.
class Session : public std::enable_shared_from_this<Session> {
 public:
  explicit Session(tcp::socket socket) : stream_(std::move(socket)) {}

  void Start() {
    parser_.header_limit(kMaxHeaderBytes);
    parser_.body_limit(0);
    stream_.expires_after(kIoTimeout);
    http::async_read(stream_, buffer_, parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->OnRead(ec);
                     });
  }

 private:
  void OnRead(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted) {
      return;  // the client went away or stalled: nothing to answer
    }
    if (ec) {
      Respond(http::status::bad_request,
              absl::StrCat("malformed request: ", ec.message(), "\n"));
      return;
    }
    const auto& request = parser_.get();
    const std::string target(request.target());
    const std::string path = target.substr(0, target.find('?'));
    if (request.method() != http::verb::get &&
        request.method() != http::verb::head) {
      Respond(http::status::method_not_allowed, "only GET /metrics\n");
    } else if (path != "/metrics") {
      Respond(http::status::not_found, "only GET /metrics\n");
    } else {
      Respond(http::status::ok, TextExposition(),
              request.method() == http::verb::head);
    }
  }

  void Respond(http::status status, std::string body, bool head = false) {
    response_.result(status);
    response_.version(11);
    response_.set(http::field::content_type,
                  status == http::status::ok
                      ? "text/plain; version=0.0.4; charset=utf-8"
                      : "text/plain; charset=utf-8");
    if (status == http::status::method_not_allowed) {
      response_.set(http::field::allow, "GET, HEAD");
    }
    response_.keep_alive(false);
    response_.body() = std::move(body);
    response_.prepare_payload();
    if (head) response_.body().clear();
    stream_.expires_after(kIoTimeout);
    http::async_write(stream_, response_,
                      [self = shared_from_this()](beast::error_code, size_t) {
                        beast::error_code ignored;
                        self->stream_.socket().shutdown(
                            tcp::socket::shutdown_send, ignored);
                      });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::request_parser<http::empty_body> parser_;
  http::response<http::string_body> response_;
};

// "host:port" with a port in [0, 65535]; the host may be bracketed IPv6.
bool SplitListen(const std::string& listen, std::string* host, int* port) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen.substr(colon + 1), port) || *port < 0 ||
      *port > 65535) {
    return false;
  }
  *host = listen.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return !host->empty();
}

}  // namespace

class MetricsServer::Impl {
 public:
  Impl() : acceptor_(io_), retry_(io_) {}

  // The pending handlers, and the sessions they hold, go with io_.
  ~Impl() {
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }

  // Binds and listens; the port actually bound, or the error.
  absl::StatusOr<int> Bind(const std::string& host, int port) {
    beast::error_code ec;
    tcp::resolver resolver(io_);
    const auto endpoints = resolver.resolve(
        host, std::to_string(port),
        tcp::resolver::passive | tcp::resolver::numeric_service, ec);
    if (ec || endpoints.empty()) {
      return absl::UnavailableError(absl::StrCat(
          "cannot resolve '", host, "': ", ec ? ec.message() : "no address"));
    }
    const tcp::endpoint endpoint = endpoints.begin()->endpoint();
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", endpoint.address().to_string(), ":",
                       port, ": ", ec.message()));
    }
    return acceptor_.local_endpoint().port();
  }

  void Start() {
    Accept();
    thread_ = std::thread([this] { io_.run(); });
  }

 private:
  void Accept() {
    acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
      if (ec) {
        // Out of descriptors or memory: try again shortly rather than spin.
        retry_.expires_after(std::chrono::milliseconds(100));
        retry_.async_wait([this](beast::error_code wait) {
          if (!wait) Accept();
        });
        return;
      }
      std::make_shared<Session>(std::move(socket))->Start();
      Accept();
    });
  }

  asio::io_context io_{1};
  tcp::acceptor acceptor_;
  asio::steady_timer retry_;
  std::thread thread_;
};

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl, std::string address)
    : impl_(std::move(impl)), address_(std::move(address)) {}

MetricsServer::~MetricsServer() = default;

absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServer(
    const std::string& listen) {
  std::string host;
  int port = -1;
  if (!SplitListen(listen, &host, &port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics listen address '", listen, "' is not host:port"));
  }
  auto impl = std::make_unique<MetricsServer::Impl>();
  auto bound = impl->Bind(host, port);
  if (!bound.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on '", listen, "': ", bound.status().message()));
  }
  impl->Start();
  const std::string address =
      absl::StrCat(listen.substr(0, listen.rfind(':')), ":", *bound);
  return std::unique_ptr<MetricsServer>(
      new MetricsServer(std::move(impl), address));
}

}  // namespace baton::metrics
