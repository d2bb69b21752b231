// A worker's Prometheus metrics, labelled role="prefill"|"decode"|"both":
//
//   baton_worker_queued_requests                gauge, engine waiting queue
//   baton_worker_queued_prefill_tokens          gauge, prompt tokens whose
//                                               prefill has not finished
//   baton_worker_running_requests               gauge, running batch size
//   baton_worker_kv_blocks_used / _free         gauges (free: held by no
//                                               request, cached included)
//   baton_worker_kv_blocks_cached               gauge, free blocks holding
//                                               a reusable prefix block
//   baton_worker_prefix_cache_query_tokens_total counter, prompt tokens
//                                               looked up in the prefix cache
//   baton_worker_prefix_cache_hit_tokens_total  counter, of those, found
//                                               (hit rate = hit / query)
//   baton_worker_kv_evictions_total             counter, cached blocks
//                                               evicted for room
//   baton_worker_kv_staging_blocks_used         gauge, a GPU worker's host
//                                               staging pool blocks held
//                                               by host-transport transfers
//   baton_worker_kv_staging_overflows_total     counter, transfers staged
//                                               in memory of their own
//                                               (the pool was full)
//   baton_worker_kv_transfers_active            gauge, handoffs + imports
//   baton_worker_prefill_tokens_total           counter, prompt tokens
//                                               prefilled
//   baton_worker_decode_tokens_total            counter, tokens sampled by
//                                               decode steps (a request's
//                                               first token comes with its
//                                               prefill and is not counted)
//   baton_worker_decode_tokens_per_second       gauge, over the window
//                                               between refreshes (>= 1 s)
//   baton_worker_kv_transfer_bytes_total{direction="sent"|"received"}
//   baton_worker_kv_transfer_seconds{direction} histogram, per transfer
//   baton_worker_requests_total{phase="prefill"|"decode", status}
//       status: "ok" (a prefill that ended with its first token and KV
//       handoff), "stop", "length" (a finished decode), or the error code
//       ("cancelled", "not_found", ...)
//
// Event methods are lock-free (counters are atomics) except histogram
// observations (prometheus-cpp's per-histogram mutex, once per transfer);
// gauges are set by Refresh, which the worker runs before each scrape.
#ifndef BATON_WORKER_SERVICE_WORKER_METRICS_H_
#define BATON_WORKER_SERVICE_WORKER_METRICS_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "baton/v1/types.pb.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "worker/engine/engine.h"
#include "worker/engine/request.h"

namespace baton {

// The `role` label of a worker: "prefill", "decode", "both" ("unspecified"
// otherwise).
std::string WorkerRoleLabel(v1::WorkerRole role);

// The `status` label of an engine stream that ended with `reason`
// ("stop", "length", "cancelled", or `error`'s code for kError).
std::string EndStatusLabel(FinishReason reason, const absl::Status& error);

class WorkerMetrics {
 public:
  using SteadyClock = std::chrono::steady_clock;

  // Registers (or finds) the metrics of a worker with `role` ("prefill",
  // "decode", "both") in `registry`, which must outlive this object.
  WorkerMetrics(prometheus::Registry& registry, absl::string_view role);
  WorkerMetrics(const WorkerMetrics&) = delete;
  WorkerMetrics& operator=(const WorkerMetrics&) = delete;

  const std::string& role() const { return role_; }

  // A prompt of `tokens` tokens has been prefilled.
  void OnPrefilled(int64_t tokens) {
    prefill_tokens_.Increment(static_cast<double>(tokens));
  }
  // Decode steps sampled `tokens` more tokens.
  void OnDecodeTokens(int64_t tokens) {
    decode_tokens_.Increment(static_cast<double>(tokens));
  }
  // One Prefill ("prefill") or Decode ("decode") stream ended with
  // `status` (a label: "ok", "stop", StatusCodeLabel(...), ...).
  void OnRequestEnded(absl::string_view phase, absl::string_view status);
  // A KV cache of `bytes` bytes went out / came in, taking `seconds`.
  void OnKvSent(uint64_t bytes, double seconds);
  void OnKvReceived(uint64_t bytes, double seconds);

  // Sets the gauges from the engine's counts; `queued_prefill_tokens` is
  // what the service tracks. The tokens/s gauge is updated when at least a
  // second has passed since its last update. Thread-safe.
  void Refresh(const EngineStats& stats, int64_t queued_prefill_tokens,
               SteadyClock::time_point now);

 private:
  const std::string role_;
  prometheus::Gauge& queued_requests_;
  prometheus::Gauge& queued_prefill_tokens_;
  prometheus::Gauge& running_requests_;
  prometheus::Gauge& kv_blocks_used_;
  prometheus::Gauge& kv_blocks_free_;
  prometheus::Gauge& kv_blocks_cached_;
  prometheus::Counter& prefix_query_tokens_;
  prometheus::Counter& prefix_hit_tokens_;
  prometheus::Counter& kv_evictions_;
  prometheus::Gauge& kv_staging_blocks_used_;
  prometheus::Counter& kv_staging_overflows_;
  prometheus::Gauge& kv_transfers_active_;
  prometheus::Counter& prefill_tokens_;
  prometheus::Counter& decode_tokens_;
  prometheus::Gauge& decode_tokens_per_second_;
  prometheus::Counter& kv_sent_bytes_;
  prometheus::Counter& kv_received_bytes_;
  prometheus::Histogram& kv_sent_seconds_;
  prometheus::Histogram& kv_received_seconds_;
  prometheus::Family<prometheus::Counter>& requests_;

  absl::Mutex rate_mu_;
  bool rate_started_ ABSL_GUARDED_BY(rate_mu_) = false;
  SteadyClock::time_point rate_since_ ABSL_GUARDED_BY(rate_mu_);
  double rate_tokens_since_ ABSL_GUARDED_BY(rate_mu_) = 0;
};

}  // namespace baton

#endif  // BATON_WORKER_SERVICE_WORKER_METRICS_H_
