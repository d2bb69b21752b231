#include "common/metrics/metrics.h"

#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "prometheus/exposer.h"
#include "prometheus/text_serializer.h"

namespace baton::metrics {

prometheus::Registry& Registry() {
  static auto* registry = new prometheus::Registry();
  return *registry;
}

std::string TextExposition() {
  const prometheus::TextSerializer serializer;
  return serializer.Serialize(Registry().Collect());
}

MetricsServer::MetricsServer(std::unique_ptr<prometheus::Exposer> exposer,
                             std::string address)
    : exposer_(std::move(exposer)), address_(std::move(address)) {}

MetricsServer::~MetricsServer() = default;

absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServer(
    const std::string& listen) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics listen address '", listen, "' is not host:port"));
  }
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(listen);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on '", listen, "': ", e.what()));
  }
  // A shared_ptr that does not own the process-wide registry.
  exposer->RegisterCollectable(std::shared_ptr<prometheus::Registry>(
      &Registry(), [](prometheus::Registry*) {}));
  const std::vector<int> ports = exposer->GetListeningPorts();
  const std::string host = listen.substr(0, colon);
  const std::string address =
      absl::StrCat(host, ":", ports.empty() ? port : ports.front());
  return std::unique_ptr<MetricsServer>(
      new MetricsServer(std::move(exposer), address));
}

}  // namespace baton::metrics
