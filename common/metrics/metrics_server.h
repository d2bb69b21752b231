// A dedicated HTTP listener for the process's metrics (a worker's or a
// coordinator's --metrics_listen): GET /metrics answers Registry() in the
// Prometheus text format after the scrape hooks ran; any other path is 404,
// any other method 405, a malformed or oversized request 400.
//
// One thread runs Boost.Asio with a 10 s limit on each connection's read
// and write, one request per connection. Its stack is an ordinary thread's:
// the listener starts in processes whose libraries carry a large static TLS
// block (cuBLASLt: about 94 KiB), where fixed 100 KiB thread stacks cannot.
#ifndef BATON_COMMON_METRICS_METRICS_SERVER_H_
#define BATON_COMMON_METRICS_METRICS_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace baton::metrics {

class MetricsServer {
 public:
  // Stops listening, ends the connections in progress and joins the thread.
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // "host:port" actually bound (port 0 in the request resolves here).
  const std::string& address() const { return address_; }

 private:
  class Impl;
  friend absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServer(
      const std::string& listen);
  MetricsServer(std::unique_ptr<Impl> impl, std::string address);

  std::unique_ptr<Impl> impl_;
  std::string address_;
};

// Starts serving Registry() at http://`listen`/metrics. `listen` is
// "host:port" (an IPv4 or bracketed IPv6 address, or a name that resolves
// to one); port 0 picks a free port. InvalidArgument for a malformed
// address, Unavailable when it cannot be resolved or bound.
absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServer(
    const std::string& listen);

}  // namespace baton::metrics

#endif  // BATON_COMMON_METRICS_METRICS_SERVER_H_
