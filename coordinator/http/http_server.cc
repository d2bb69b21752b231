// Why Boost.Beast on Boost.Asio: the OpenAI front door must hold thousands
// of idle keep-alive connections and long Server-Sent-Event streams to
// clients that read at any speed. Beast's asynchronous HTTP/1.1 parser and
// serializer over Asio strands give exactly that with no thread per
// connection: an idle connection is a socket and a buffer, an SSE stream is
// plain chunked writes queued on its own connection, and a slow reader only
// grows its own queue. It is header-only (Debian libboost-dev), and its
// parser enforces body and header limits before buffering a body.
#include "coordinator/http/http_server.h"

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <cstdio>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/file_stamp.h"
#include "coordinator/http/http_session.h"

namespace baton::http {
namespace {

namespace asio = boost::asio;
using tcp = boost::asio::ip::tcp;

struct HostPort {
  std::string host;
  std::string port;
};

absl::StatusOr<HostPort> SplitHostPort(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HTTP listen address must be HOST:PORT, got '", listen, "'"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return HostPort{host, listen.substr(colon + 1)};
}

// What identifies the TLS files' contents.
std::string FilesStamp(const TlsFiles& files) {
  return baton::FilesStamp({&files.cert, &files.key, &files.ca});
}

absl::StatusOr<std::shared_ptr<asio::ssl::context>> MakeTlsContext(
    const TlsFiles& files) {
  if (absl::Status s = CheckTlsFiles(files, /*server=*/true, "--tls");
      !s.ok()) {
    return s;
  }
  auto context =
      std::make_shared<asio::ssl::context>(asio::ssl::context::tls_server);
  context->set_options(
      asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
      asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
      asio::ssl::context::no_tlsv1_1);
  boost::system::error_code ec;
  context->use_certificate_chain_file(files.cert, ec);
  if (!ec)
    context->use_private_key_file(files.key, asio::ssl::context::pem, ec);
  if (!ec && !files.ca.empty()) {
    context->load_verify_file(files.ca, ec);
    context->set_verify_mode(asio::ssl::verify_peer |
                             asio::ssl::verify_fail_if_no_peer_cert);
  }
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTPS certificate files: ", ec.message()));
  }
  return context;
}

}  // namespace

struct HttpServer::Impl {
  Impl(const HttpServerOptions& o, HttpHandler h)
      : home(std::make_shared<SessionHome>(o, std::move(h))),
        options(home->options),
        io(home->io),
        acceptor(asio::make_strand(io)),
        retry_timer(acceptor.get_executor()) {}

  void Accept() {
    acceptor.async_accept(
        asio::make_strand(io),
        [this](boost::system::error_code ec, tcp::socket socket) {
          if (!acceptor.is_open()) return;
          if (!ec) {
            if (options.tls.enabled()) {
              std::shared_ptr<asio::ssl::context> context = TlsContext();
              std::make_shared<TlsHttpSession>(
                  boost::beast::ssl_stream<boost::beast::tcp_stream>(
                      boost::beast::tcp_stream(std::move(socket)), *context),
                  home, context)
                  ->Run();
            } else {
              std::make_shared<PlainHttpSession>(
                  boost::beast::tcp_stream(std::move(socket)), home)
                  ->Run();
            }
            return Accept();
          }
          // Out of descriptors and the like: try again shortly instead of
          // spinning.
          retry_timer.expires_after(std::chrono::milliseconds(50));
          retry_timer.async_wait([this](boost::system::error_code) {
            if (acceptor.is_open()) Accept();
          });
        });
  }

  // The TLS context for a new connection: the current one, or a new one
  // if the files changed (looked at once per reload interval; a set that
  // does not load keeps the current one). The acceptor's strand only.
  std::shared_ptr<asio::ssl::context> TlsContext() {
    const absl::Time now = absl::Now();
    if (now < next_tls_look) return tls_context;
    next_tls_look = now + options.tls.reload_interval;
    std::string stamp = FilesStamp(options.tls);
    if (stamp == tls_stamp) return tls_context;
    auto context = MakeTlsContext(options.tls);
    if (!context.ok()) {
      std::fprintf(stderr, "HTTPS: keeping the previous certificate: %s\n",
                   std::string(context.status().message()).c_str());
      return tls_context;
    }
    tls_stamp = std::move(stamp);
    tls_context = std::move(*context);
    return tls_context;
  }

  // The io_context, options, handler and busy count, co-owned by every
  // session (a handler may hold one past the server's end).
  const std::shared_ptr<SessionHome> home;
  const HttpServerOptions& options;
  SessionHome::Io& io;
  std::shared_ptr<asio::ssl::context> tls_context;
  std::string tls_stamp;
  absl::Time next_tls_look;
  std::atomic<bool> accepting{true};
  tcp::acceptor acceptor;
  asio::steady_timer retry_timer;
  std::vector<std::thread> threads;
  std::string address;
  bool stopped = false;
};

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const HttpServerOptions& options, HttpHandler handler) {
  if (options.threads < 1 || options.max_body_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTP server needs threads >= 1 and max_body_bytes >= 1, "
                     "got ",
                     options.threads, " and ", options.max_body_bytes));
  }
  auto host_port = SplitHostPort(options.listen);
  if (!host_port.ok()) return host_port.status();
  auto impl = std::make_unique<Impl>(options, std::move(handler));
  if (options.tls.enabled()) {
    impl->tls_stamp = FilesStamp(options.tls);
    auto context = MakeTlsContext(options.tls);
    if (!context.ok()) return context.status();
    impl->tls_context = std::move(*context);
    impl->next_tls_look = absl::Now() + options.tls.reload_interval;
  }
  boost::system::error_code ec;
  tcp::resolver resolver(impl->io);
  auto endpoints = resolver.resolve(host_port->host, host_port->port,
                                    tcp::resolver::passive, ec);
  if (ec || endpoints.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTP listen address '", options.listen,
                     "' does not resolve: ", ec.message()));
  }
  const tcp::endpoint endpoint = endpoints.begin()->endpoint();
  tcp::acceptor& acceptor = impl->acceptor;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen for HTTP on ", options.listen, ": ", ec.message()));
  }
  const std::string host = endpoint.address().is_v6()
                               ? absl::StrCat("[", host_port->host, "]")
                               : host_port->host;
  impl->address = absl::StrCat(host, ":", acceptor.local_endpoint().port());
  impl->Accept();
  for (int i = 0; i < options.threads; ++i) {
    impl->threads.emplace_back([io = &impl->io] { io->run(); });
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(absl::ZeroDuration()); }

const std::string& HttpServer::address() const { return impl_->address; }

void HttpServer::StopAccepting() {
  if (!impl_->accepting.exchange(false)) return;
  asio::post(impl_->acceptor.get_executor(), [impl = impl_.get()] {
    boost::system::error_code ignored;
    impl->acceptor.close(ignored);
    impl->retry_timer.cancel();
  });
}

void HttpServer::Stop(absl::Duration flush) {
  if (impl_->stopped) return;
  impl_->stopped = true;
  StopAccepting();
  const absl::Time deadline = absl::Now() + flush;
  while (impl_->home->busy.load() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  impl_->io.stop();
  for (std::thread& t : impl_->threads) t.join();
  boost::system::error_code ignored;
  impl_->acceptor.close(ignored);
  // Frees the connections that only queued handlers held; those whose
  // exchange a handler still holds go when it lets go.
  impl_->home->Shutdown();
}

}  // namespace baton::http
