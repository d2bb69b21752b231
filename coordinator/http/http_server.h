// A small asynchronous HTTP/1.1 server (Boost.Beast over Boost.Asio) that
// hands each request to one handler and lets the handler answer with a
// whole response or a chunked stream (Server-Sent Events), from any thread.
//
// Every connection is a socket and a few buffers on an Asio strand; no
// thread is tied to a connection, so idle keep-alive connections and slow
// readers cost memory only. A response's bytes go to that connection's own
// write queue: a slow reader grows its queue and delays nobody else.
#ifndef BATON_COORDINATOR_HTTP_HTTP_SERVER_H_
#define BATON_COORDINATOR_HTTP_HTTP_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/grpc/tls.h"

namespace baton::http {

struct HttpServerOptions {
  // --- behaviour ---
  // "HOST:PORT"; port 0 picks a free port (see HttpServer::address()).
  std::string listen = "127.0.0.1:8000";
  // A request body above this many bytes gets 413 and the connection closes.
  int64_t max_body_bytes = int64_t{1} << 20;
  // A request (headers and body) must arrive within this long, measured
  // from the end of the previous response on a keep-alive connection; a
  // connection idle for longer is closed.
  absl::Duration read_timeout = absl::Seconds(120);
  // HTTPS with these files (mutual TLS when tls.ca is set: a client
  // certificate is required); the files are looked at once per
  // tls.reload_interval and a changed set is used for new connections.
  // Nothing named: plaintext.
  TlsFiles tls;
  // --- performance ---
  // I/O threads running every connection's handlers.
  int threads = 2;
};

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target without its query string
  std::string body;
  // The Authorization header's value ("" without one).
  std::string authorization;
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// One request's response channel. Thread-safe; every call returns at once
// (the bytes are queued on the connection). Exactly one of Respond or
// StartStream ... EndStream per request; calls after the client has gone
// are dropped.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;

  // The whole response, with Content-Length.
  virtual void Respond(int status, std::string content_type, std::string body,
                       HttpHeaders headers = {}) = 0;
  // The status line and headers of a streamed (chunked) response, then any
  // number of Write calls, then EndStream.
  virtual void StartStream(int status, std::string content_type) = 0;
  virtual void Write(std::string data) = 0;
  virtual void EndStream() = 0;
  // `callback` runs once, on an I/O thread, if the client disconnects (or a
  // write to it fails) before the response is complete; at once if that
  // already happened. It must not block.
  virtual void SetOnDisconnect(std::function<void()> callback) = 0;
};

// Runs on an I/O thread for every request; must not block (hand long work
// to other threads and answer through the exchange later).
using HttpHandler =
    std::function<void(HttpRequest, std::shared_ptr<HttpExchange>)>;

class HttpServer {
 public:
  // Listens on options.listen and starts the I/O threads. InvalidArgument
  // for a malformed address or option, Unavailable if it cannot listen.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const HttpServerOptions& options, HttpHandler handler);
  // Stop(no flush), then frees every connection.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // "HOST:PORT" with the bound port.
  const std::string& address() const;
  // Closes the listener; open connections keep being served.
  void StopAccepting();
  // StopAccepting, then waits up to `flush` for every connection that owes
  // a response to finish writing it, then stops the I/O threads (what is
  // still queued is dropped). Idempotent. Exchanges may still be called
  // and released afterwards, from any thread, also after the server is
  // destroyed (the calls are dropped).
  void Stop(absl::Duration flush);

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace baton::http

#endif  // BATON_COORDINATOR_HTTP_HTTP_SERVER_H_
