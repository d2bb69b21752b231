// Process-wide Prometheus metrics for Baton's servers.
//
// Every metric lives in one registry per process (Registry()); servers expose
// it either through their own HTTP port (TextExposition() renders the
// Prometheus text format 0.0.4) or through a dedicated listener
// (StartMetricsServer, e.g. a worker's --metrics_listen).
#ifndef BATON_COMMON_METRICS_METRICS_H_
#define BATON_COMMON_METRICS_METRICS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/registry.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace baton::metrics {

// The registry every Baton metric is registered in. Never null; lives for
// the whole process.
prometheus::Registry& Registry();

// All metrics of Registry() in the Prometheus text exposition format.
std::string TextExposition();

// A running HTTP listener that serves GET /metrics from Registry().
class MetricsServer {
 public:
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // "host:port" actually bound (port 0 in the request resolves here).
  const std::string& address() const { return address_; }

 private:
  friend absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServer(
      const std::string& listen);
  MetricsServer(std::unique_ptr<prometheus::Exposer> exposer,
                std::string address);

  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string address_;
};

// Starts serving Registry() at http://`listen`/metrics. `listen` is
// "host:port"; port 0 picks a free port. InvalidArgument for a malformed
// address, Unavailable when the port cannot be bound.
absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServer(
    const std::string& listen);

}  // namespace baton::metrics

#endif  // BATON_COMMON_METRICS_METRICS_H_
