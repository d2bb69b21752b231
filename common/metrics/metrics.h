// Process-wide Prometheus metrics for Baton's servers.
//
// Every metric lives in one registry per process (Registry()); servers expose
// it either through their own HTTP port (TextExposition() renders the
// Prometheus text format 0.0.4) or through a dedicated listener
// (metrics_server.h, e.g. a worker's --metrics_listen).
//
// Gauges that mirror state owned elsewhere (queue lengths, free KV blocks,
// healthy workers) are refreshed on demand: their owner registers a scrape
// hook (AddScrapeHook) that runs before every collection of Registry().
#ifndef BATON_COMMON_METRICS_METRICS_H_
#define BATON_COMMON_METRICS_METRICS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "prometheus/registry.h"

namespace baton::metrics {

// The registry every Baton metric is registered in. Never null; lives for
// the whole process.
prometheus::Registry& Registry();

// All metrics of Registry() in the Prometheus text exposition format, after
// running every scrape hook.
std::string TextExposition();

// `registry` in the text exposition format (no scrape hooks run). For
// registries other than Registry(), e.g. a test's own.
std::string RenderText(const prometheus::Registry& registry);

// A refresh function that runs before every collection of Registry()
// (TextExposition and each GET /metrics) while this handle lives. Hooks run
// one at a time under a process-wide lock: a hook must be quick and must not
// collect metrics itself. Destroying the handle waits for a running call of
// its hook to return.
class ScrapeHook {
 public:
  ~ScrapeHook();
  ScrapeHook(const ScrapeHook&) = delete;
  ScrapeHook& operator=(const ScrapeHook&) = delete;

 private:
  friend std::unique_ptr<ScrapeHook> AddScrapeHook(std::function<void()>);
  explicit ScrapeHook(uint64_t id) : id_(id) {}
  const uint64_t id_;
};

// Registers `refresh` (see ScrapeHook). `refresh` must not be empty.
std::unique_ptr<ScrapeHook> AddScrapeHook(std::function<void()> refresh);

// Runs every registered hook once (what a collection of Registry() does).
void RunScrapeHooks();

// Histogram bounds, in seconds, for request-level latencies (queue time,
// time to first token, end-to-end, KV transfers): 1 ms to 10 min.
const std::vector<double>& RequestLatencyBuckets();
// Histogram bounds, in seconds, for per-token latencies (time per output
// token, inter-token latency): 0.5 ms to 10 s.
const std::vector<double>& TokenLatencyBuckets();

// The `status` label of an outcome with this code: "ok", "cancelled",
// "deadline_exceeded", ... (the canonical code name in lower case).
std::string StatusCodeLabel(absl::StatusCode code);

}  // namespace baton::metrics

#endif  // BATON_COMMON_METRICS_METRICS_H_
