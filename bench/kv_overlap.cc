#include "bench/kv_overlap.h"

#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "worker/engine/engine.h"
#include "worker/engine/kv_sink.h"
#include "worker/transport/tcp_kv_transport.h"

namespace baton::kvbench {
namespace {

// Times the sink calls of one handoff (written by the handoff's sender
// thread; read once the prefill reported done).
struct SinkTimes {
  double send_s = 0, finish_s = 0;
};

class TimedSink : public KvSink {
 public:
  TimedSink(std::unique_ptr<KvSink> inner, SinkTimes* times)
      : inner_(std::move(inner)), times_(times) {}
  absl::Status SendLayer(int64_t layer,
                         std::span<const uint8_t> bytes) override {
    const double a = Now();
    absl::Status s =
        inner_ ? inner_->SendLayer(layer, bytes) : absl::OkStatus();
    times_->send_s += Now() - a;
    return s;
  }
  absl::Status SendLayerChunks(int64_t layer,
                               std::span<const std::span<const uint8_t>> chunks,
                               KvReadGate& gate) override {
    const double a = Now();
    absl::Status s = inner_ ? inner_->SendLayerChunks(layer, chunks, gate)
                            : absl::OkStatus();
    times_->send_s += Now() - a;
    return s;
  }
  absl::Status Finish() override {
    const double a = Now();
    absl::Status s = inner_ ? inner_->Finish() : absl::OkStatus();
    times_->finish_s += Now() - a;
    return s;
  }
  void Abort(absl::Status reason) override {
    if (inner_) inner_->Abort(std::move(reason));
  }

 private:
  std::unique_ptr<KvSink> inner_;  // null: discard (no transfer)
  SinkTimes* times_;
};

struct OverlapRun {
  double compute_s = 0;   // handoff start .. last layer computed
  double wall_s = 0;      // handoff start .. last layer confirmed
  double exposed_s = 0;   // last layer computed .. confirmed
  double transfer_s = 0;  // time the sender spent in the sink
  double ttft_s = 0;
  uint64_t kv_bytes = 0;
};

// One prefill of `prompt` on `prefill` whose KV goes to `endpoint` as
// transfer `id` (or is discarded when endpoint is empty).
OverlapRun SplitPrefill(Engine& prefill, const std::vector<int32_t>& prompt,
                        const std::string& endpoint, uint64_t id) {
  SinkTimes times;
  PrefillOptions options;
  options.timeout = std::chrono::seconds(600);
  KvSinkFactory tcp;
  if (!endpoint.empty()) {
    // Connections are reused across runs, as a worker's handoffs reuse them.
    static const auto connections = std::make_shared<TcpKvConnectionPool>();
    TcpKvSenderOptions sender_options;
    sender_options.pool = connections;
    tcp = TcpKvSinkFactory(endpoint, id, "", sender_options);
  }
  options.make_sink =
      [&](const KvSinkInfo& info) -> absl::StatusOr<std::unique_ptr<KvSink>> {
    std::unique_ptr<KvSink> inner;
    if (tcp) {
      auto opened = tcp(info);
      if (!opened.ok()) return opened.status();
      inner = std::move(*opened);
    }
    return std::unique_ptr<KvSink>(
        std::make_unique<TimedSink>(std::move(inner), &times));
  };
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = 1;
  PrefillOutput last;
  Must(
      prefill.SubmitPrefill({"p" + std::to_string(id), prompt, params}, options,
                            [&](const PrefillOutput& o) {
                              if (o.done) last = o;
                            }),
      "SubmitPrefill");
  prefill.RunUntilIdle();
  Must(last.error, "split prefill");
  OverlapRun r;
  r.wall_s = last.handoff.transfer_s;
  r.exposed_s = last.handoff.tail_s;
  r.compute_s = r.wall_s - r.exposed_s;
  r.transfer_s = times.send_s + times.finish_s;
  r.ttft_s = last.metrics.ttft_s();
  r.kv_bytes = last.handoff.kv_bytes;
  return r;
}

}  // namespace

nlohmann::json OverlapCase(const Shape& shape, const ModelWeights& weights,
                           const Tokenizer& tokenizer,
                           const OverlapOptions& options) {
  const int64_t tokens = options.prompt_tokens;
  const int64_t chunk = options.chunk_tokens;
  const int threads = options.threads;
  const int repeats = options.repeats;
  const ModelConfig& c = weights.config();
  // The prompt plus the one sampled token must fit the context.
  const int64_t n =
      tokens + 1 <= c.context_length ? tokens : c.context_length - 192;
  const int64_t budget = chunk == 0 ? n : chunk;
  std::mt19937 rng(static_cast<uint32_t>(n));
  std::uniform_int_distribution<int32_t> pick(0, c.vocab_size - 1);
  std::vector<int32_t> prompt(n);
  for (int32_t& t : prompt) t = pick(rng);

  const int64_t blocks = (n + 1 + 15) / 16;
  EngineOptions po;
  po.num_threads = threads;
  po.kv_cache_blocks = blocks;
  po.scheduler.max_num_batched_tokens = budget;
  auto prefill = Must(Engine::Create(po, &weights, &tokenizer), "prefill");
  EngineOptions dopt;
  dopt.num_threads = 1;
  dopt.kv_cache_blocks = blocks;
  auto decode = Must(Engine::Create(dopt, &weights, &tokenizer), "decode");
  TouchPool(prefill->kv_cache());
  TouchPool(decode->kv_cache());
  auto receiver =
      Must(TcpKvReceiver::Start({}, decode->ImportCallbacks()), "receiver");

  // Warm-up (activation buffers grow to the chunk size), then the compute
  // time without a transfer.
  SplitPrefill(*prefill,
               std::vector<int32_t>(prompt.begin(), prompt.begin() + budget),
               "", 0);
  OverlapRun alone;
  if (options.baseline) {
    alone = SplitPrefill(*prefill, prompt, "", 1);
  }
  std::vector<double> compute, wall, exposed, transfer, ttft, hidden;
  uint64_t kv_bytes = 0;
  for (int r = 0; r < repeats; ++r) {
    const uint64_t id = 100 + r;
    const std::string rid = "d" + std::to_string(id);
    ImportOptions import;
    import.transfer_id = id;
    import.num_prompt_tokens = n;
    import.max_tokens = 1;
    Must(decode->ReserveImport(rid, import).status(), "ReserveImport");
    const OverlapRun run =
        SplitPrefill(*prefill, prompt, receiver->endpoint(), id);
    decode->Cancel(rid);
    compute.push_back(run.compute_s * 1e3);
    wall.push_back(run.wall_s * 1e3);
    exposed.push_back(run.exposed_s * 1e3);
    transfer.push_back(run.transfer_s * 1e3);
    ttft.push_back(run.ttft_s * 1e3);
    hidden.push_back(100 * (1 - run.exposed_s / run.transfer_s));
    kv_bytes = run.kv_bytes;
  }
  const EngineStats ds = decode->stats();
  if (ds.kv_blocks_free != ds.kv_blocks_total) {
    Die("overlap", absl::InternalError("decode engine leaked KV blocks"));
  }
  nlohmann::json j;
  j["shape"] = shape.name;
  j["prompt_tokens"] = n;
  j["chunk_tokens"] = budget;
  j["threads"] = threads;
  j["repeats"] = repeats;
  j["kv_bytes"] = kv_bytes;
  if (options.baseline) {
    j["compute_alone_ms"] = alone.compute_s * 1e3;
    j["ttft_alone_ms"] = alone.ttft_s * 1e3;
  }
  j["compute_ms"] = compute;
  j["handoff_wall_ms"] = wall;
  j["transfer_ms"] = transfer;
  j["exposed_ms"] = exposed;
  j["hidden_pct"] = hidden;
  j["ttft_ms"] = ttft;
  j["median"] = {
      {"compute_ms", Median(compute)},   {"handoff_wall_ms", Median(wall)},
      {"transfer_ms", Median(transfer)}, {"exposed_ms", Median(exposed)},
      {"hidden_pct", Median(hidden)},    {"ttft_ms", Median(ttft)}};
  return j;
}

}  // namespace baton::kvbench
