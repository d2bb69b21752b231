#include "common/metrics/metrics.h"

#include <exception>
#include <map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/check.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "prometheus/text_serializer.h"

namespace baton::metrics {
namespace {

// The registered scrape hooks, by id.
struct HookList {
  absl::Mutex mu;
  uint64_t next_id ABSL_GUARDED_BY(mu) = 1;
  std::map<uint64_t, std::function<void()>> hooks ABSL_GUARDED_BY(mu);
};

HookList& Hooks() {
  static auto* hooks = new HookList();
  return *hooks;
}

// What the exposer collects: Registry() after the scrape hooks ran.
class HookedRegistry final : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    RunScrapeHooks();
    return Registry().Collect();
  }
};

}  // namespace

prometheus::Registry& Registry() {
  static auto* registry = new prometheus::Registry();
  return *registry;
}

std::string TextExposition() {
  RunScrapeHooks();
  return RenderText(Registry());
}

std::string RenderText(const prometheus::Registry& registry) {
  const prometheus::TextSerializer serializer;
  return serializer.Serialize(registry.Collect());
}

ScrapeHook::~ScrapeHook() {
  HookList& list = Hooks();
  absl::MutexLock lock(&list.mu);
  list.hooks.erase(id_);
}

std::unique_ptr<ScrapeHook> AddScrapeHook(std::function<void()> refresh) {
  BATON_CHECK(refresh != nullptr);
  HookList& list = Hooks();
  absl::MutexLock lock(&list.mu);
  const uint64_t id = list.next_id++;
  list.hooks.emplace(id, std::move(refresh));
  return std::unique_ptr<ScrapeHook>(new ScrapeHook(id));
}

void RunScrapeHooks() {
  HookList& list = Hooks();
  absl::MutexLock lock(&list.mu);
  for (auto& [id, hook] : list.hooks) hook();
}

const std::vector<double>& RequestLatencyBuckets() {
  static const auto* buckets = new std::vector<double>{
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,   0.25,  0.5,  1.0,
      2.5,   5.0,    10.0,  20.0, 30.0,  60.0, 120.0, 300.0, 600.0};
  return *buckets;
}

const std::vector<double>& TokenLatencyBuckets() {
  static const auto* buckets = new std::vector<double>{
      0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.04,
      0.05,   0.075, 0.1,    0.25,  0.5,    1.0,  2.5,   5.0,  10.0};
  return *buckets;
}

std::string StatusCodeLabel(absl::StatusCode code) {
  return absl::AsciiStrToLower(absl::StatusCodeToString(code));
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
  // One collectable for every server: Registry() behind the scrape hooks.
  static const auto* hooked =
      new std::shared_ptr<HookedRegistry>(std::make_shared<HookedRegistry>());
  exposer->RegisterCollectable(*hooked);
  const std::vector<int> ports = exposer->GetListeningPorts();
  const std::string host = listen.substr(0, colon);
  const std::string address =
      absl::StrCat(host, ":", ports.empty() ? port : ports.front());
  return std::unique_ptr<MetricsServer>(
      new MetricsServer(std::move(exposer), address));
}

}  // namespace baton::metrics
