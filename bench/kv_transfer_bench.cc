// Host KV transfer over loopback TCP against this machine's loopback TCP
// bandwidth, measured in the same run (see docs/performance.md):
//   - loopback ceiling: one socket pair on 127.0.0.1, messages of each
//     case's per-layer payload size (and one large size), with the kernel's
//     autotuned buffers (as the transport uses) and with large fixed ones;
//   - raw transfer: a KvCache holding N tokens at a model's layout, sent
//     layer by layer from the pool as the engine's handoff does (chunk list,
//     streaming checksum over the chunks, TcpKvSender::SendLayerChunks) to a
//     TcpKvReceiver that receives straight into reserved blocks of a second
//     KvCache and checksums them in place; also "send only" (contiguous
//     payloads exported and checksummed beforehand) and the cost of each
//     copy on its own;
//   - overlap: a split prefill between two engines in this process over
//     loopback TCP: the sender's transfer time, the part of it left after
//     the last layer's compute (exposed), and the prefill compute time.
//
//   build/bin/kv_transfer_bench --json=/tmp/kv_transfer.json
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "bench/common/loopback_bandwidth.h"
#include "common/test_util.h"
#include "model/synth/shapes.h"
#include "model/synth/synth_model.h"
#include "nlohmann/json.hpp"
#include "worker/engine/engine.h"
#include "worker/engine/kv_sink.h"
#include "worker/kv_cache/kv_cache.h"
#include "worker/transport/tcp_kv_transport.h"

ABSL_FLAG(std::string, model, "",
          "GGUF of the default model (default: $BATON_DEFAULT_MODEL)");
ABSL_FLAG(std::string, synth_model, "/tmp/baton_kvbench_llama-3.2-1b.gguf",
          "synthetic Llama-3.2-1B GGUF for the overlap runs; written (Q4_1, "
          "seed 0) if missing");
ABSL_FLAG(bool, llama_1b, true, "include the Llama-3.2-1B shape");
ABSL_FLAG(std::string, tokens, "1024,8192", "cache lengths in tokens");
ABSL_FLAG(int, repeats, 5, "raw transfer repetitions (median reported)");
ABSL_FLAG(int, threads, 0, "prefill compute threads; 0 = all cores");
ABSL_FLAG(bool, overlap, true, "run the split-prefill overlap measurement");
ABSL_FLAG(int, overlap_repeats, 1, "split prefills per case (median)");
ABSL_FLAG(std::string, overlap_chunks, "0,512",
          "prefill chunk budgets (max_num_batched_tokens) for the overlap "
          "runs; 0 = the whole prompt in one chunk");
ABSL_FLAG(uint64_t, loopback_bytes, uint64_t{1} << 30,
          "bytes per loopback measurement");
ABSL_FLAG(int, socket_buffer, 4 << 20,
          "SO_SNDBUF/SO_RCVBUF of the fixed-buffer loopback measurement");
ABSL_FLAG(bool, raw, true, "run the loopback and raw transfer measurement");
ABSL_FLAG(std::string, overlap_tokens, "",
          "prompt lengths of the overlap runs (default: --tokens)");
ABSL_FLAG(std::string, overlap_shapes, "default,llama-3.2-1b",
          "shapes of the overlap runs");
ABSL_FLAG(bool, overlap_baseline, true,
          "also time each overlap prefill without a transfer");
ABSL_FLAG(std::string, json, "", "write every figure to this JSON file");

namespace baton {
namespace {

using Json = nlohmann::json;

double Now() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::vector<int64_t> ParseList(const std::string& s) {
  std::vector<int64_t> out;
  for (absl::string_view v : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int64_t x;
    if (absl::SimpleAtoi(v, &x) && x >= 0) out.push_back(x);
  }
  return out;
}

[[noreturn]] void Die(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "kv_transfer_bench: %s: %s\n", what.c_str(),
               s.ToString().c_str());
  std::exit(1);
}

template <typename T>
T Must(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Die(what, v.status());
  return std::move(*v);
}

void Must(const absl::Status& s, const std::string& what) {
  if (!s.ok()) Die(what, s);
}

struct Shape {
  std::string name;
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  std::string model_path;  // for the overlap runs
};

std::unique_ptr<KvCache> MakeCache(const Shape& shape, int64_t num_blocks) {
  KvCacheOptions o;
  o.num_layers = shape.num_layers;
  o.num_kv_heads = shape.num_kv_heads;
  o.head_dim = shape.head_dim;
  o.block_size = 16;
  o.dtype = DType::kF16;
  o.num_blocks = num_blocks;
  o.prefault = true;
  return Must(KvCache::Create(o), "KvCache::Create");
}

// Writes every byte of the pool (as a long-running worker's pool is), so no
// timed copy pays first-touch page faults.
void TouchPool(KvCache& cache) {
  for (int64_t l = 0; l < cache.layout().num_layers; ++l) {
    for (int32_t b = 0; b < cache.num_blocks_total(); ++b) {
      std::memset(cache.LayerBlock(l, b), 0, cache.chunk_bytes());
    }
  }
}

// ------------------------------------------------------ loopback ceiling

struct LoopbackFigures {
  std::vector<double> autotuned, fixed;  // GB/s per repeat
  double ceiling() const { return std::max(Median(autotuned), Median(fixed)); }
};

void MeasureLoopback(uint64_t message_bytes, LoopbackFigures* out) {
  bench::LoopbackOptions o;
  o.message_bytes = message_bytes;
  o.total_bytes = absl::GetFlag(FLAGS_loopback_bytes);
  out->autotuned.push_back(
      Must(bench::MeasureLoopbackTcp(o), "loopback").gb_per_s);
  o.socket_buffer_bytes = absl::GetFlag(FLAGS_socket_buffer);
  out->fixed.push_back(Must(bench::MeasureLoopbackTcp(o), "loopback").gb_per_s);
}

// ------------------------------------------------------------ raw transfer

// The decode side of the raw transfers: one reserved table every transfer
// id imports into, and the receiver's verdicts.
class Destination {
 public:
  Destination(const Shape& shape, int64_t num_tokens)
      : cache_(MakeCache(shape, (num_tokens + 15) / 16 + 3)),
        num_tokens_(num_tokens) {
    // Shifts block ids so they differ from the sender's.
    Must(cache_->Reserve(pad_, 3 * 16), "Reserve");
    Must(cache_->Reserve(table_, num_tokens), "Reserve");
  }
  ~Destination() {
    cache_->Free(table_);
    cache_->Free(pad_);
  }

  KvReceiverCallbacks Callbacks() {
    KvReceiverCallbacks cb;
    cb.lookup = [this](uint64_t) -> absl::StatusOr<KvTransferTarget> {
      KvTransferTarget t;
      t.cache = cache_.get();
      t.table = &table_;
      t.expected_layout = cache_->layout();
      t.num_tokens = num_tokens_;
      return t;
    };
    cb.on_done = [this](uint64_t id, absl::Status s) {
      absl::MutexLock lock(&mu_);
      done_[id] = std::move(s);
    };
    return cb;
  }
  absl::Status Verdict(uint64_t id) {
    absl::MutexLock lock(&mu_);
    auto it = done_.find(id);
    return it == done_.end() ? absl::InternalError("no on_done") : it->second;
  }
  KvCache& cache() { return *cache_; }
  BlockTable& table() { return table_; }

 private:
  std::unique_ptr<KvCache> cache_;
  int64_t num_tokens_;
  BlockTable pad_, table_;
  absl::Mutex mu_;
  std::map<uint64_t, absl::Status> done_ ABSL_GUARDED_BY(mu_);
};

// Seconds of one transfer and of the sender's stages inside it (chunks:
// listing the layer's chunks in the pool).
struct TransferTiming {
  double total = 0, chunks_s = 0, checksum_s = 0, send_s = 0, finish_s = 0;
};

// One transfer of every layer of src/table to `endpoint`. With `pre` the
// payloads and checksums are taken from there (send only); otherwise each
// layer is sent from the pool: its chunks listed, checksummed in place and
// passed to SendLayerChunks, inside the timing.
TransferTiming TransferOnce(const KvCache& src, const BlockTable& table,
                            const std::string& endpoint, uint64_t id,
                            const std::vector<std::vector<uint8_t>>* pre,
                            const std::vector<uint64_t>* sums) {
  TransferTiming t;
  const double start = Now();
  auto sender = Must(TcpKvSender::Connect(endpoint, id), "Connect");
  KvTransferHeader h;
  h.transfer_id = id;
  h.request_id = "bench";
  h.layout = src.layout();
  h.num_tokens = table.num_tokens();
  h.payload_bytes = src.LayerBytes(table);
  for (int64_t l = 0; l < src.layout().num_layers; ++l) {
    h.layer = l;
    if (pre != nullptr) {
      h.checksum = (*sums)[l];
      const double c = Now();
      Must(sender->SendLayer(h, (*pre)[l]), "SendLayer");
      t.send_s += Now() - c;
      continue;
    }
    const double a = Now();
    const std::vector<std::span<const uint8_t>> chunks =
        Must(src.LayerChunks(table, l, table.num_tokens()), "LayerChunks");
    const double b = Now();
    h.checksum = KvChecksumChunks(chunks);
    const double c = Now();
    Must(sender->SendLayerChunks(h, chunks, nullptr), "SendLayerChunks");
    t.chunks_s += b - a;
    t.checksum_s += c - b;
    t.send_s += Now() - c;
  }
  const double f = Now();
  Must(sender->Finish(), "Finish");
  const double end = Now();
  t.finish_s = end - f;
  t.total = end - start;
  return t;
}

Json RawCase(const Shape& shape, int64_t num_tokens, int repeats,
             LoopbackFigures* loopback) {
  auto src = MakeCache(shape, (num_tokens + 15) / 16);
  BlockTable table;
  Must(src->Reserve(table, num_tokens), "Reserve");
  std::mt19937_64 rng(num_tokens * 131 + shape.num_layers);
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    for (int32_t b : table.block_ids()) {
      uint8_t* p = src->LayerBlock(l, b);
      for (uint64_t i = 0; i + 8 <= src->chunk_bytes(); i += 8) {
        const uint64_t x = rng();
        std::memcpy(p + i, &x, 8);
      }
    }
  }
  Must(src->SetNumTokens(table, num_tokens), "SetNumTokens");
  const uint64_t layer_bytes = src->LayerBytes(table);
  const uint64_t bytes = layer_bytes * shape.num_layers;
  Destination dst(shape, num_tokens);
  auto receiver = Must(TcpKvReceiver::Start({}, dst.Callbacks()), "receiver");
  std::vector<uint8_t> staging(layer_bytes, 0);
  std::vector<std::vector<uint8_t>> pre(shape.num_layers);
  std::vector<uint64_t> sums(shape.num_layers);
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    pre[l].resize(layer_bytes);
    Must(src->ExportLayer(table, l, pre[l]), "ExportLayer");
    sums[l] = KvChecksum(pre[l], src->chunk_bytes());
  }

  // Warm-up transfer, then check the destination holds the same bytes.
  uint64_t id = 1;
  TransferOnce(*src, table, receiver->endpoint(), id, nullptr, nullptr);
  Must(dst.Verdict(id++), "warm-up transfer");
  Must(dst.cache().SetNumTokens(dst.table(), num_tokens), "SetNumTokens");
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    Must(dst.cache().ExportLayer(dst.table(), l, staging), "ExportLayer");
    if (staging != pre[l]) {
      Die("verify", absl::DataLossError("layer " + std::to_string(l) +
                                        " differs after the transfer"));
    }
  }

  std::vector<double> full_s, send_only_s, chunks_s, checksum_s, send_s,
      finish_s, iso_export, iso_checksum, iso_import, iso_memcpy;
  for (int r = 0; r < repeats; ++r) {
    MeasureLoopback(layer_bytes, loopback);
    TransferTiming t =
        TransferOnce(*src, table, receiver->endpoint(), id, nullptr, nullptr);
    Must(dst.Verdict(id++), "transfer");
    full_s.push_back(t.total);
    chunks_s.push_back(t.chunks_s);
    checksum_s.push_back(t.checksum_s);
    send_s.push_back(t.send_s);
    finish_s.push_back(t.finish_s);
    t = TransferOnce(*src, table, receiver->endpoint(), id, &pre, &sums);
    Must(dst.Verdict(id++), "send-only transfer");
    send_only_s.push_back(t.total);
    // Each copy on its own, one thread, whole cache.
    double a = Now();
    for (int64_t l = 0; l < shape.num_layers; ++l) {
      Must(src->ExportLayer(table, l, staging), "ExportLayer");
    }
    iso_export.push_back(Now() - a);
    a = Now();
    uint64_t sink = 0;
    for (int64_t l = 0; l < shape.num_layers; ++l)
      sink ^= KvChecksum(pre[l], src->chunk_bytes());
    iso_checksum.push_back(Now() - a);
    if (sink == 42) std::printf(" ");
    a = Now();
    for (int64_t l = 0; l < shape.num_layers; ++l) {
      Must(dst.cache().ImportLayer(dst.table(), l, num_tokens, pre[l]),
           "ImportLayer");
    }
    iso_import.push_back(Now() - a);
    a = Now();
    for (int64_t l = 0; l < shape.num_layers; ++l) {
      std::memcpy(staging.data(), pre[l].data(), layer_bytes);
    }
    iso_memcpy.push_back(Now() - a);
  }
  src->Free(table);

  const double gb = static_cast<double>(bytes) / 1e9;
  auto rates = [&](const std::vector<double>& secs) {
    std::vector<double> out;
    for (double s : secs) out.push_back(gb / s);
    return out;
  };
  auto ms = [](const std::vector<double>& secs) {
    std::vector<double> out;
    for (double s : secs) out.push_back(s * 1e3);
    return out;
  };
  Json j;
  j["shape"] = shape.name;
  j["tokens"] = num_tokens;
  j["layers"] = shape.num_layers;
  j["layer_bytes"] = layer_bytes;
  j["bytes"] = bytes;
  j["repeats"] = repeats;
  j["loopback_autotuned_gbps"] = loopback->autotuned;
  j["loopback_fixed_buffer_gbps"] = loopback->fixed;
  j["loopback_ceiling_gbps"] = loopback->ceiling();
  j["transfer_ms"] = ms(full_s);
  j["transfer_gbps"] = rates(full_s);
  j["transfer_gbps_median"] = gb / Median(full_s);
  j["transfer_pct_of_loopback"] =
      100 * gb / Median(full_s) / loopback->ceiling();
  j["send_only_ms"] = ms(send_only_s);
  j["send_only_gbps_median"] = gb / Median(send_only_s);
  j["send_only_pct_of_loopback"] =
      100 * gb / Median(send_only_s) / loopback->ceiling();
  j["sender_stages_ms"] = {{"chunks", Median(chunks_s) * 1e3},
                           {"checksum", Median(checksum_s) * 1e3},
                           {"send_layer", Median(send_s) * 1e3},
                           {"finish", Median(finish_s) * 1e3}};
  j["isolated_ms"] = {{"export", Median(iso_export) * 1e3},
                      {"checksum", Median(iso_checksum) * 1e3},
                      {"import", Median(iso_import) * 1e3},
                      {"memcpy", Median(iso_memcpy) * 1e3}};
  return j;
}

// ------------------------------------------------------------------ overlap

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
  if (!endpoint.empty()) tcp = TcpKvSinkFactory(endpoint, id);
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

Json OverlapCase(const Shape& shape, const ModelWeights& weights,
                 const Tokenizer& tokenizer, int64_t tokens, int64_t chunk,
                 int threads, int repeats) {
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
  if (absl::GetFlag(FLAGS_overlap_baseline)) {
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
  Json j;
  j["shape"] = shape.name;
  j["prompt_tokens"] = n;
  j["chunk_tokens"] = budget;
  j["threads"] = threads;
  j["repeats"] = repeats;
  j["kv_bytes"] = kv_bytes;
  if (absl::GetFlag(FLAGS_overlap_baseline)) {
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

// ---------------------------------------------------------------- main

void PrintRaw(const Json& j) {
  const auto& st = j["sender_stages_ms"];
  const auto& iso = j["isolated_ms"];
  std::printf(
      "%-13s %6lld %8.1f %7.0f %8.2f %6.2f %8.2f %6.0f%% | %6.2f %5.0f%% | "
      "%5.1f %5.1f %5.1f %5.1f | %5.1f %5.1f %5.1f %5.1f\n",
      j["shape"].get<std::string>().c_str(), j["tokens"].get<long long>(),
      j["bytes"].get<double>() / 1048576, j["layer_bytes"].get<double>() / 1024,
      Median(j["transfer_ms"].get<std::vector<double>>()),
      j["transfer_gbps_median"].get<double>(),
      j["loopback_ceiling_gbps"].get<double>(),
      j["transfer_pct_of_loopback"].get<double>(),
      j["send_only_gbps_median"].get<double>(),
      j["send_only_pct_of_loopback"].get<double>(), st["chunks"].get<double>(),
      st["checksum"].get<double>(), st["send_layer"].get<double>(),
      st["finish"].get<double>(), iso["export"].get<double>(),
      iso["checksum"].get<double>(), iso["import"].get<double>(),
      iso["memcpy"].get<double>());
}

void RunRaw(const std::vector<Shape>& shapes,
            const std::vector<int64_t>& token_counts, int repeats, Json& out) {
  // Large-message ceiling.
  LoopbackFigures large;
  for (int r = 0; r < repeats; ++r) MeasureLoopback(64 << 20, &large);
  out["loopback_64MiB"] = {{"autotuned_gbps", large.autotuned},
                           {"fixed_buffer_gbps", large.fixed}};
  std::printf(
      "loopback TCP, 64 MiB messages: %.2f GB/s autotuned buffers, %.2f GB/s "
      "%d KiB buffers (median of %d)\n\n",
      Median(large.autotuned), Median(large.fixed),
      absl::GetFlag(FLAGS_socket_buffer) / 1024, repeats);

  std::printf(
      "raw KV transfer, median of %d (GB/s = 1e9 bytes/s; ceiling = loopback "
      "at the layer size, better of autotuned / fixed buffers)\n",
      repeats);
  std::printf("%-13s %6s %8s %7s %8s %6s %8s %7s | %-13s | %-23s | %-23s\n",
              "shape", "tokens", "MiB", "KiB/lyr", "ms", "GB/s", "ceiling",
              "% ceil", "send-only", "sender ms: lst sum snd fin",
              "alone ms: exp sum imp cpy");
  for (const Shape& shape : shapes) {
    for (int64_t n : token_counts) {
      LoopbackFigures lb;
      Json j = RawCase(shape, n, repeats, &lb);
      PrintRaw(j);
      out["raw"].push_back(j);
    }
  }
}

int Main() {
  std::string model = absl::GetFlag(FLAGS_model);
  if (model.empty()) model = testing::DefaultModelPath();
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0) {
    threads = static_cast<int>(std::thread::hardware_concurrency());
  }
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  const std::vector<int64_t> token_counts =
      ParseList(absl::GetFlag(FLAGS_tokens));

  auto weights = Must(ModelWeights::Open(model), "open " + model);
  std::vector<Shape> shapes;
  {
    const ModelConfig& c = weights->config();
    shapes.push_back(
        {"default", c.num_layers, c.num_kv_heads, c.head_dim, model});
  }
  if (absl::GetFlag(FLAGS_llama_1b)) {
    SynthShape s = Must(FindSynthShape("llama-3.2-1b"), "shape");
    shapes.push_back({"llama-3.2-1b", s.num_layers, s.num_kv_heads, s.head_dim,
                      absl::GetFlag(FLAGS_synth_model)});
  }
  Json out;
  out["model"] = model;
  out["threads"] = threads;
  std::printf("model: %s; loopback: %.0f MiB per measurement\n", model.c_str(),
              absl::GetFlag(FLAGS_loopback_bytes) / 1048576.0);

  if (absl::GetFlag(FLAGS_raw)) RunRaw(shapes, token_counts, repeats, out);

  if (absl::GetFlag(FLAGS_overlap)) {
    const int orep = std::max(1, absl::GetFlag(FLAGS_overlap_repeats));
    std::printf(
        "\nsplit prefill over loopback TCP, %d threads, median of %d "
        "(transfer = sender time in the sink; exposed = after the last "
        "layer's compute)\n",
        threads, orep);
    std::printf("%-13s %6s %6s %9s %9s %9s %9s %8s %9s %9s\n", "shape",
                "prompt", "chunk", "alone ms", "comp ms", "xfer ms", "exposed",
                "hidden", "wall ms", "ttft ms");
    std::vector<int64_t> overlap_tokens =
        ParseList(absl::GetFlag(FLAGS_overlap_tokens));
    if (overlap_tokens.empty()) overlap_tokens = token_counts;
    const std::vector<std::string> overlap_shapes = absl::StrSplit(
        absl::GetFlag(FLAGS_overlap_shapes), ',', absl::SkipEmpty());
    for (const Shape& shape : shapes) {
      if (std::find(overlap_shapes.begin(), overlap_shapes.end(), shape.name) ==
          overlap_shapes.end()) {
        continue;
      }
      if (!std::filesystem::exists(shape.model_path)) {
        std::printf("(writing %s)\n", shape.model_path.c_str());
        std::fflush(stdout);
        SynthModelOptions so;
        so.weight_type = DType::kQ4_1;
        Must(WriteSynthModel(Must(FindSynthShape(shape.name), "shape"), so,
                             shape.model_path, nullptr),
             "synth");
      }
      auto w = Must(ModelWeights::Open(shape.model_path), "open");
      auto tok = Must(Tokenizer::FromGguf(*w->gguf()), "tokenizer");
      for (int64_t n : overlap_tokens) {
        for (int64_t chunk : ParseList(absl::GetFlag(FLAGS_overlap_chunks))) {
          if (chunk >= n) continue;
          Json j = OverlapCase(shape, *w, *tok, n, chunk, threads, orep);
          const Json& m = j["median"];
          std::printf(
              "%-13s %6lld %6lld %9.1f %9.1f %9.1f %9.1f %7.1f%% %9.1f "
              "%9.1f\n",
              shape.name.c_str(), j["prompt_tokens"].get<long long>(),
              j["chunk_tokens"].get<long long>(),
              j.value("compute_alone_ms", 0.0), m["compute_ms"].get<double>(),
              m["transfer_ms"].get<double>(), m["exposed_ms"].get<double>(),
              m["hidden_pct"].get<double>(), m["handoff_wall_ms"].get<double>(),
              m["ttft_ms"].get<double>());
          std::fflush(stdout);
          out["overlap"].push_back(j);
        }
      }
    }
  }

  const std::string json_path = absl::GetFlag(FLAGS_json);
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << out.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "kv_transfer_bench: cannot write %s\n",
                   json_path.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return baton::Main();
}
