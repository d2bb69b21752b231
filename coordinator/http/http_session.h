// One HTTP/1.1 connection of HttpServer (internal): reads requests one at a
// time, hands each to the handler, and writes the response from its queue.
// Every member runs on the connection's strand.
//
// While a request is being answered the session keeps one read open on the
// socket ("watch"): end-of-stream or a reset there means the client left,
// and the exchange's on-disconnect callback fires (the gateway cancels its
// Generate calls). Bytes that arrive meanwhile (a pipelined request) are
// kept for the next parse.
#ifndef BATON_COORDINATOR_HTTP_HTTP_SESSION_H_
#define BATON_COORDINATOR_HTTP_HTTP_SESSION_H_

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/http/http_server.h"

namespace baton::http {

// What the sessions of one server share. Each session co-owns it, so a
// session that outlives its HttpServer (its exchange still held by a
// handler finishing on another thread) still finds the io_context's
// services, the options and the busy count it refers to.
class SessionHome {
 public:
  SessionHome(const HttpServerOptions& options, HttpHandler handler)
      : options(options), handler(std::move(handler)) {}

  // Once the threads running `io` have been joined: destroys every handler
  // still queued (what ~io_context does first), and with them the sessions
  // only they held. Exchanges are inert from then on. Idempotent.
  void Shutdown();
  // Runs `f` (an exchange's call, or the release of its session) never at
  // the same time as Shutdown: Asio forbids touching an I/O object while
  // its io_context shuts down. On the thread running Shutdown (a queued
  // handler holding an exchange is being destroyed), runs it at once.
  template <typename F>
  void Guarded(F&& f) {
    if (shutter_.load() == std::this_thread::get_id()) return f();
    absl::ReaderMutexLock lock(&mu_);
    f();
  }

  const HttpServerOptions options;
  const HttpHandler handler;
  // Sessions that owe a response (handling or flushing one).
  std::atomic<int> busy{0};

  class Io : public boost::asio::io_context {
   public:
    using boost::asio::io_context::shutdown;
  };
  Io io;

 private:
  absl::Mutex mu_;
  std::atomic<std::thread::id> shutter_;
};

// The exchange a handler gets: forwards to its session, and keeps the
// session's use and release away from SessionHome::Shutdown.
class GatedExchange final : public HttpExchange {
 public:
  GatedExchange(std::shared_ptr<HttpExchange> session,
                std::shared_ptr<SessionHome> home)
      : session_(std::move(session)), home_(std::move(home)) {}
  ~GatedExchange() override;

  void Respond(int status, std::string content_type, std::string body,
               HttpHeaders headers) override;
  void StartStream(int status, std::string content_type) override;
  void Write(std::string data) override;
  void EndStream() override;
  void SetOnDisconnect(std::function<void()> callback) override;

 private:
  std::shared_ptr<HttpExchange> session_;
  const std::shared_ptr<SessionHome> home_;
};

template <typename Stream>
class HttpSession final
    : public HttpExchange,
      public std::enable_shared_from_this<HttpSession<Stream>> {
 public:
  // `stream` runs on a strand of home->io. `tls` (TLS streams only) is the
  // context `stream` was made with.
  HttpSession(Stream stream, std::shared_ptr<SessionHome> home,
              std::shared_ptr<boost::asio::ssl::context> tls = nullptr);
  ~HttpSession() override;
  // Starts reading the first request (after the TLS handshake).
  void Run();

  void Respond(int status, std::string content_type, std::string body,
               HttpHeaders headers) override;
  void StartStream(int status, std::string content_type) override;
  void Write(std::string data) override;
  void EndStream() override;
  void SetOnDisconnect(std::function<void()> callback) override;

 private:
  enum class State {
    kReading,    // waiting for (the rest of) a request
    kHandling,   // the handler owns the request; response not yet complete
    kFlushing,   // response complete, bytes still queued
    kLingering,  // after a rejected request: half-closed, draining input
    kClosed,
  };
  using Request =
      boost::beast::http::request_parser<boost::beast::http::string_body>;

  template <typename F>
  void OnStrand(F&& f);
  boost::beast::tcp_stream& Lowest() {
    return boost::beast::get_lowest_layer(stream_);
  }
  void SetState(State state);

  void DoRead();
  void OnHeader(boost::beast::error_code ec);
  void ReadBody();
  void OnRead(boost::beast::error_code ec);
  // A response to a malformed request, then a lingering close.
  void Reject(int status, const std::string& message, const std::string& code);
  void Watch();
  void OnWatch(boost::beast::error_code ec, size_t bytes);
  void Enqueue(std::string bytes);
  void DoWrite();
  void OnWrite(boost::beast::error_code ec);
  void ResponseComplete();
  void ClientGone();
  // Half-closes, then reads and drops what the client still sends (so it
  // sees the response rather than a reset) until it closes or a timeout.
  void Linger();
  void Close();

  // Before everything that refers to it: destroyed last.
  const std::shared_ptr<SessionHome> home_;
  const HttpServerOptions& options_ = home_->options;
  const HttpHandler& handler_ = home_->handler;
  std::atomic<int>& busy_ = home_->busy;
  // Before stream_, which refers to it.
  const std::shared_ptr<boost::asio::ssl::context> tls_;
  Stream stream_;
  boost::beast::flat_buffer buffer_;
  std::optional<Request> parser_;
  State state_ = State::kReading;
  unsigned version_ = 11;
  bool keep_alive_ = true;
  bool chunked_ = false;
  bool watching_ = false;
  bool writing_ = false;
  std::deque<std::string> queue_;
  std::vector<std::string> in_flight_;
  std::function<void()> on_disconnect_;
  bool gone_ = false;
  // Close a rejected request's connection with Linger (its body may still
  // be arriving).
  bool linger_ = false;
};

using PlainHttpSession = HttpSession<boost::beast::tcp_stream>;
using TlsHttpSession =
    HttpSession<boost::beast::ssl_stream<boost::beast::tcp_stream>>;

}  // namespace baton::http

#endif  // BATON_COORDINATOR_HTTP_HTTP_SESSION_H_
