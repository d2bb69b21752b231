#include "worker/service/worker_metrics.h"

#include <utility>

#include "common/metrics/metrics.h"

namespace baton {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

prometheus::Gauge& AddGauge(prometheus::Registry& registry,
                            const std::string& name, const std::string& help,
                            const std::string& role) {
  return BuildGauge().Name(name).Help(help).Register(registry).Add(
      {{"role", role}});
}

prometheus::Counter& AddCounter(prometheus::Registry& registry,
                                const std::string& name,
                                const std::string& help,
                                const prometheus::Labels& labels) {
  return BuildCounter().Name(name).Help(help).Register(registry).Add(labels);
}

constexpr char kBytesHelp[] =
    "Bytes of KV cache handed between workers, by direction";
constexpr char kSecondsHelp[] =
    "Time of one KV cache transfer (sent: first layer out to the last "
    "confirmed; received: first frame in to the last layer landed)";

}  // namespace

std::string WorkerRoleLabel(v1::WorkerRole role) {
  switch (role) {
    case v1::WORKER_ROLE_PREFILL:
      return "prefill";
    case v1::WORKER_ROLE_DECODE:
      return "decode";
    case v1::WORKER_ROLE_BOTH:
      return "both";
    default:
      return "unspecified";
  }
}

std::string EndStatusLabel(FinishReason reason, const absl::Status& error) {
  if (reason == FinishReason::kNone) return "ok";
  if (reason == FinishReason::kError) {
    return metrics::StatusCodeLabel(error.ok() ? absl::StatusCode::kUnknown
                                               : error.code());
  }
  return std::string(FinishReasonName(reason));  // stop, length, cancelled
}

WorkerMetrics::WorkerMetrics(prometheus::Registry& registry,
                             absl::string_view role)
    : role_(role),
      queued_requests_(AddGauge(registry, "baton_worker_queued_requests",
                                "Requests waiting in the engine's queue",
                                role_)),
      queued_prefill_tokens_(AddGauge(
          registry, "baton_worker_queued_prefill_tokens",
          "Prompt tokens of requests whose prefill has not finished", role_)),
      running_requests_(AddGauge(registry, "baton_worker_running_requests",
                                 "Sequences in the engine's running batch",
                                 role_)),
      kv_blocks_used_(AddGauge(registry, "baton_worker_kv_blocks_used",
                               "KV cache blocks in use or reserved", role_)),
      kv_blocks_free_(AddGauge(
          registry, "baton_worker_kv_blocks_free",
          "KV cache blocks no request holds (cached prefix blocks included)",
          role_)),
      kv_blocks_cached_(AddGauge(
          registry, "baton_worker_kv_blocks_cached",
          "Free KV cache blocks holding a reusable prefix block", role_)),
      prefix_query_tokens_(AddCounter(
          registry, "baton_worker_prefix_cache_query_tokens_total",
          "Prompt tokens looked up in the prefix cache", {{"role", role_}})),
      prefix_hit_tokens_(
          AddCounter(registry, "baton_worker_prefix_cache_hit_tokens_total",
                     "Prompt tokens whose KV came from the prefix cache",
                     {{"role", role_}})),
      kv_evictions_(AddCounter(registry, "baton_worker_kv_evictions_total",
                               "Cached prefix blocks evicted for room",
                               {{"role", role_}})),
      kv_staging_blocks_used_(AddGauge(
          registry, "baton_worker_kv_staging_blocks_used",
          "Blocks of a GPU worker's host staging pool held by transfers over "
          "host transports",
          role_)),
      kv_staging_overflows_(AddCounter(
          registry, "baton_worker_kv_staging_overflows_total",
          "Transfers staged in host memory of their own because the staging "
          "pool was full",
          {{"role", role_}})),
      kv_transfers_active_(AddGauge(
          registry, "baton_worker_kv_transfers_active",
          "KV handoffs being sent plus imports reserved and not started",
          role_)),
      prefill_tokens_(AddCounter(registry, "baton_worker_prefill_tokens_total",
                                 "Prompt tokens prefilled", {{"role", role_}})),
      decode_tokens_(AddCounter(
          registry, "baton_worker_decode_tokens_total",
          "Tokens sampled by decode steps (a request's first token, sampled "
          "with its prefill, is not counted)",
          {{"role", role_}})),
      decode_tokens_per_second_(AddGauge(
          registry, "baton_worker_decode_tokens_per_second",
          "Decode tokens per second over the last refresh window (>= 1 s)",
          role_)),
      kv_sent_bytes_(
          AddCounter(registry, "baton_worker_kv_transfer_bytes_total",
                     kBytesHelp, {{"role", role_}, {"direction", "sent"}})),
      kv_received_bytes_(
          AddCounter(registry, "baton_worker_kv_transfer_bytes_total",
                     kBytesHelp, {{"role", role_}, {"direction", "received"}})),
      kv_sent_seconds_(BuildHistogram()
                           .Name("baton_worker_kv_transfer_seconds")
                           .Help(kSecondsHelp)
                           .Register(registry)
                           .Add({{"role", role_}, {"direction", "sent"}},
                                metrics::RequestLatencyBuckets())),
      kv_received_seconds_(
          BuildHistogram()
              .Name("baton_worker_kv_transfer_seconds")
              .Help(kSecondsHelp)
              .Register(registry)
              .Add({{"role", role_}, {"direction", "received"}},
                   metrics::RequestLatencyBuckets())),
      requests_(BuildCounter()
                    .Name("baton_worker_requests_total")
                    .Help("Prefill and Decode streams that ended, by phase "
                          "and status (ok, stop, length or an error code)")
                    .Register(registry)) {}

void WorkerMetrics::OnRequestEnded(absl::string_view phase,
                                   absl::string_view status) {
  requests_
      .Add({{"role", role_},
            {"phase", std::string(phase)},
            {"status", std::string(status)}})
      .Increment();
}

void WorkerMetrics::OnKvSent(uint64_t bytes, double seconds) {
  kv_sent_bytes_.Increment(static_cast<double>(bytes));
  kv_sent_seconds_.Observe(seconds);
}

void WorkerMetrics::OnKvReceived(uint64_t bytes, double seconds) {
  kv_received_bytes_.Increment(static_cast<double>(bytes));
  kv_received_seconds_.Observe(seconds);
}

void WorkerMetrics::Refresh(const EngineStats& stats,
                            int64_t queued_prefill_tokens,
                            SteadyClock::time_point now) {
  queued_requests_.Set(static_cast<double>(stats.num_waiting));
  queued_prefill_tokens_.Set(static_cast<double>(queued_prefill_tokens));
  running_requests_.Set(static_cast<double>(stats.num_running));
  kv_blocks_used_.Set(
      static_cast<double>(stats.kv_blocks_total - stats.kv_blocks_free));
  kv_blocks_free_.Set(static_cast<double>(stats.kv_blocks_free));
  kv_blocks_cached_.Set(static_cast<double>(stats.kv_blocks_cached));
  kv_staging_blocks_used_.Set(
      static_cast<double>(stats.kv_staging_blocks_used));
  kv_transfers_active_.Set(
      static_cast<double>(stats.num_handoffs + stats.num_imports));

  const double tokens = decode_tokens_.Value();
  absl::MutexLock lock(&rate_mu_);
  // The engine keeps running totals; the counters follow them (under the
  // lock, so two refreshes never add the same delta twice).
  for (auto [counter, total] :
       {std::pair{&prefix_query_tokens_, stats.prefix_query_tokens},
        std::pair{&prefix_hit_tokens_, stats.prefix_hit_tokens},
        std::pair{&kv_evictions_, stats.kv_evictions},
        std::pair{&kv_staging_overflows_, stats.kv_staging_own_areas}}) {
    const double delta = static_cast<double>(total) - counter->Value();
    if (delta > 0) counter->Increment(delta);
  }
  if (!rate_started_) {
    rate_started_ = true;
    rate_since_ = now;
    rate_tokens_since_ = tokens;
    return;
  }
  const double seconds =
      std::chrono::duration<double>(now - rate_since_).count();
  if (seconds < 1.0) return;
  decode_tokens_per_second_.Set((tokens - rate_tokens_since_) / seconds);
  rate_since_ = now;
  rate_tokens_since_ = tokens;
}

}  // namespace baton
