#include "common/metrics/metrics.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/synchronization/mutex.h"
#include "common/check.h"
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

}  // namespace baton::metrics
