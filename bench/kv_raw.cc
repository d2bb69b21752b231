#include "bench/kv_raw.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "bench/common/loopback_bandwidth.h"
#include "common/testing/test_pki.h"
#include "worker/kv_cache/kv_cache.h"
#include "worker/transport/kv_tls.h"
#include "worker/transport/tcp_kv_transport.h"

namespace baton::kvbench {
namespace {

// The secret of every raw transfer (32 bytes, as ReserveKv draws them).
constexpr char kBenchSecret[] = "kv-transfer-bench-secret-32bytes";

using Json = nlohmann::json;

// GB/s per repeat, with autotuned and with fixed socket buffers: one
// resident message-sized buffer at each end (in cache), and source and
// destination regions of the whole cache's size (the transfer's footprint).
struct LoopbackFigures {
  std::vector<double> autotuned, fixed;
  std::vector<double> region_autotuned, region_fixed;
  double ceiling() const { return std::max(Median(autotuned), Median(fixed)); }
  double region_ceiling() const {
    return std::max(Median(region_autotuned), Median(region_fixed));
  }
};

// Each figure is the better of two receive styles: one recv(MSG_WAITALL)
// per message, and recv() calls of at most 256 KiB (as the transport's
// receiver makes). region_bytes 0 measures only the in-cache figures.
void MeasureLoopback(uint64_t message_bytes, uint64_t region_bytes,
                     const RawOptions& options, LoopbackFigures* out) {
  bench::LoopbackOptions o;
  o.message_bytes = message_bytes;
  o.total_bytes = options.loopback_bytes;
  o.receiver_cpu = options.receiver_cpu;
  auto gbps = [&] {
    o.recv_call_bytes = 0;
    const double whole =
        Must(bench::MeasureLoopbackTcp(o), "loopback").gb_per_s;
    o.recv_call_bytes = uint64_t{256} << 10;
    return std::max(whole,
                    Must(bench::MeasureLoopbackTcp(o), "loopback").gb_per_s);
  };
  out->autotuned.push_back(gbps());
  o.socket_buffer_bytes = options.loopback_fixed_buffer;
  out->fixed.push_back(gbps());
  if (region_bytes == 0) return;
  o.region_bytes = region_bytes;
  out->region_fixed.push_back(gbps());
  o.socket_buffer_bytes = 0;
  out->region_autotuned.push_back(gbps());
}

// When the receiver saw each transfer's milestones (Now() seconds).
struct ReceiverTimes {
  double first_frame = 0;  // lookup: the first header has been read
  double last_layer = 0;   // the last layer landed and its trailer matched
  double done = 0;         // on_done: the finish frame has been read
};

// The decode side of the raw transfers: one reserved table every transfer
// id imports into, the receiver's verdicts and when its milestones came.
class Destination {
 public:
  Destination(const Shape& shape, int64_t num_tokens, int receiver_cpu)
      : cache_(MakeCache(shape, (num_tokens + 15) / 16 + 3)),
        num_tokens_(num_tokens),
        receiver_cpu_(receiver_cpu) {
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
    // Every transfer proves this secret, as a worker's reservations do.
    cb.secret = [](uint64_t) -> absl::StatusOr<std::string> {
      return std::string(kBenchSecret);
    };
    cb.lookup = [this](uint64_t id) -> absl::StatusOr<KvTransferTarget> {
      const double t = Now();
      // The receiver's connection thread: pinned at its first transfer.
      bench::PinCurrentThread(receiver_cpu_);
      {
        absl::MutexLock lock(&mu_);
        times_[id].first_frame = t;
      }
      KvTransferTarget target;
      target.cache = cache_.get();
      target.table = &table_;
      target.expected_layout = cache_->layout();
      target.num_tokens = num_tokens_;
      return target;
    };
    cb.on_layer = [this](uint64_t id, int64_t) {
      const double t = Now();
      absl::MutexLock lock(&mu_);
      times_[id].last_layer = t;
    };
    cb.on_done = [this](uint64_t id, absl::Status s) {
      const double t = Now();
      absl::MutexLock lock(&mu_);
      times_[id].done = t;
      done_[id] = std::move(s);
    };
    return cb;
  }
  absl::Status Verdict(uint64_t id) {
    absl::MutexLock lock(&mu_);
    auto it = done_.find(id);
    return it == done_.end() ? absl::InternalError("no on_done") : it->second;
  }
  ReceiverTimes Times(uint64_t id) {
    absl::MutexLock lock(&mu_);
    return times_[id];
  }
  KvCache& cache() { return *cache_; }
  BlockTable& table() { return table_; }

 private:
  std::unique_ptr<KvCache> cache_;
  int64_t num_tokens_;
  BlockTable pad_, table_;
  const int receiver_cpu_;
  absl::Mutex mu_;
  std::map<uint64_t, absl::Status> done_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, ReceiverTimes> times_ ABSL_GUARDED_BY(mu_);
};

// Seconds of one transfer, the sender's stages inside it (chunks: listing
// the layer's chunks in the pool; send: SendLayerChunks, hashing included)
// and the receiver's milestones relative to the sender's start.
struct TransferTiming {
  double total = 0, connect_s = 0, chunks_s = 0, send_s = 0, finish_s = 0;
  double first_frame_s = 0, last_layer_s = 0, done_s = 0;
};

// The TLS identity of the --kv_tls variants: a throw-away CA and one
// certificate for 127.0.0.1 that both ends present, written to a fresh
// temporary directory.
std::shared_ptr<KvTls> BenchTls() {
  static std::shared_ptr<KvTls> tls = [] {
    auto ca = Must(testing::TestCa::Create("kv-transfer-bench CA"), "CA");
    const testing::PemPair leaf =
        Must(ca->Issue("kv-transfer-bench"), "certificate");
    // Kept (and re-read on change checks) until the process exits.
    static testing::TempDir dir =
        Must(testing::TempDir::Create("kv_transfer_bench_tls"), "temp dir");
    KvTlsFiles files{dir.File("cert.pem"), dir.File("key.pem"),
                     dir.File("ca.pem")};
    Must(testing::WriteFileAtomically(files.cert, leaf.cert), "cert.pem");
    Must(testing::WriteFileAtomically(files.key, leaf.key), "key.pem");
    Must(testing::WriteFileAtomically(files.ca, ca->cert_pem()), "ca.pem");
    return Must(KvTls::Create(files), "KvTls");
  }();
  return tls;
}

// One transfer of every layer of src/table to `endpoint`. With `pre` the
// payloads and checksums are taken from there (send only); otherwise each
// layer is sent from the pool as TransportKvSink does: its chunks listed
// and passed to SendLayerChunks with checksum 0 (hashed while sent).
TransferTiming TransferOnce(const KvCache& src, const BlockTable& table,
                            const std::string& endpoint, uint64_t id,
                            const TcpKvSenderOptions& options,
                            const std::vector<std::vector<uint8_t>>* pre,
                            const std::vector<uint64_t>* sums) {
  TransferTiming t;
  const double start = Now();
  TcpKvSenderOptions proving = options;
  proving.transfer_secret = kBenchSecret;
  auto sender = Must(TcpKvSender::Connect(endpoint, id, proving), "Connect");
  t.connect_s = Now() - start;
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
    h.checksum = 0;
    Must(sender->SendLayerChunks(h, chunks, nullptr), "SendLayerChunks");
    t.chunks_s += b - a;
    t.send_s += Now() - b;
  }
  const double f = Now();
  Must(sender->Finish(), "Finish");
  const double end = Now();
  t.finish_s = end - f;
  t.total = end - start;
  return t;
}

// Per-repeat figures of one variant.
struct VariantFigures {
  std::vector<double> total, connect, chunks, send, finish, first_frame,
      last_layer, done;
  void Add(const TransferTiming& t) {
    total.push_back(t.total);
    connect.push_back(t.connect_s);
    chunks.push_back(t.chunks_s);
    send.push_back(t.send_s);
    finish.push_back(t.finish_s);
    first_frame.push_back(t.first_frame_s);
    last_layer.push_back(t.last_layer_s);
    done.push_back(t.done_s);
  }
};

std::vector<double> Millis(const std::vector<double>& secs) {
  std::vector<double> out;
  for (double s : secs) out.push_back(s * 1e3);
  return out;
}

Json RawCase(const Shape& shape, int64_t num_tokens,
             const RawOptions& options) {
  const int repeats = std::max(1, options.repeats);
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
  Destination dst(shape, num_tokens, options.receiver_cpu);
  std::vector<std::unique_ptr<TcpKvReceiver>> receivers;
  std::vector<TcpKvSenderOptions> sender_options;
  for (const RawVariant& v : options.variants) {
    TcpKvReceiverOptions ro;
    ro.socket_buffer_bytes = v.socket_buffer_bytes;
    if (v.tls) ro.tls = BenchTls();
    receivers.push_back(
        Must(TcpKvReceiver::Start(ro, dst.Callbacks()), "receiver"));
    TcpKvSenderOptions so;
    so.send_call_bytes = v.send_call_bytes;
    so.socket_buffer_bytes = v.socket_buffer_bytes;
    if (v.pooled) so.pool = std::make_shared<TcpKvConnectionPool>();
    if (v.tls) so.tls = BenchTls();
    sender_options.push_back(so);
  }
  std::vector<uint8_t> staging(layer_bytes, 0);
  std::vector<std::vector<uint8_t>> pre(shape.num_layers);
  std::vector<uint64_t> sums(shape.num_layers);
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    pre[l].resize(layer_bytes);
    Must(src->ExportLayer(table, l, pre[l]), "ExportLayer");
    sums[l] = KvChecksum(pre[l], src->chunk_bytes());
  }

  // Warm-up transfer per variant, then check the destination holds the
  // same bytes.
  uint64_t id = 1;
  for (size_t v = 0; v < receivers.size(); ++v) {
    TransferOnce(*src, table, receivers[v]->endpoint(), id, sender_options[v],
                 nullptr, nullptr);
    Must(dst.Verdict(id++), "warm-up transfer");
  }
  Must(dst.cache().SetNumTokens(dst.table(), num_tokens), "SetNumTokens");
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    Must(dst.cache().ExportLayer(dst.table(), l, staging), "ExportLayer");
    if (staging != pre[l]) {
      Die("verify", absl::DataLossError("layer " + std::to_string(l) +
                                        " differs after the transfer"));
    }
  }

  LoopbackFigures loopback;
  std::vector<VariantFigures> figures(receivers.size());
  std::vector<double> send_only_s, iso_export, iso_checksum, iso_import,
      iso_memcpy;
  auto timed = [&](size_t v, const std::vector<std::vector<uint8_t>>* p,
                   const std::vector<uint64_t>* s) {
    TransferTiming t = TransferOnce(*src, table, receivers[v]->endpoint(), id,
                                    sender_options[v], p, s);
    Must(dst.Verdict(id), "transfer");
    return t;
  };
  for (int r = 0; r < repeats; ++r) {
    MeasureLoopback(layer_bytes, bytes, options, &loopback);
    for (size_t v = 0; v < receivers.size(); ++v) {
      const double start = Now();
      TransferTiming t = timed(v, nullptr, nullptr);
      const ReceiverTimes rt = dst.Times(id++);
      t.first_frame_s = rt.first_frame - start;
      t.last_layer_s = rt.last_layer - start;
      t.done_s = rt.done - start;
      figures[v].Add(t);
    }
    send_only_s.push_back(timed(0, &pre, &sums).total);
    ++id;
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
  Json j;
  j["shape"] = shape.name;
  j["tokens"] = num_tokens;
  j["layers"] = shape.num_layers;
  j["layer_bytes"] = layer_bytes;
  j["bytes"] = bytes;
  j["repeats"] = repeats;
  j["loopback_autotuned_gbps"] = loopback.autotuned;
  j["loopback_fixed_buffer_gbps"] = loopback.fixed;
  j["loopback_ceiling_gbps"] = loopback.ceiling();
  j["loopback_region_autotuned_gbps"] = loopback.region_autotuned;
  j["loopback_region_fixed_buffer_gbps"] = loopback.region_fixed;
  j["loopback_region_ceiling_gbps"] = loopback.region_ceiling();
  for (size_t v = 0; v < figures.size(); ++v) {
    const VariantFigures& f = figures[v];
    Json jv;
    jv["variant"] = options.variants[v].name;
    jv["send_call_bytes"] = options.variants[v].send_call_bytes;
    jv["socket_buffer_bytes"] = options.variants[v].socket_buffer_bytes;
    jv["tls"] = options.variants[v].tls;
    jv["transfer_ms"] = Millis(f.total);
    jv["transfer_gbps_median"] = gb / Median(f.total);
    jv["transfer_pct_of_loopback"] =
        100 * gb / Median(f.total) / loopback.ceiling();
    jv["transfer_pct_of_loopback_region"] =
        100 * gb / Median(f.total) / loopback.region_ceiling();
    jv["sender_stages_ms"] = {{"connect", Median(f.connect) * 1e3},
                              {"chunks", Median(f.chunks) * 1e3},
                              {"send_layer", Median(f.send) * 1e3},
                              {"finish", Median(f.finish) * 1e3}};
    jv["receiver_ms"] = {{"first_frame", Median(f.first_frame) * 1e3},
                         {"last_layer", Median(f.last_layer) * 1e3},
                         {"done", Median(f.done) * 1e3}};
    j["variants"].push_back(jv);
  }
  j["send_only_ms"] = Millis(send_only_s);
  j["send_only_gbps_median"] = gb / Median(send_only_s);
  j["send_only_pct_of_loopback"] =
      100 * gb / Median(send_only_s) / loopback.ceiling();
  j["isolated_ms"] = {{"export", Median(iso_export) * 1e3},
                      {"checksum", Median(iso_checksum) * 1e3},
                      {"import", Median(iso_import) * 1e3},
                      {"memcpy", Median(iso_memcpy) * 1e3}};
  return j;
}

void PrintRaw(const Json& j) {
  const auto& iso = j["isolated_ms"];
  bool first = true;
  for (const Json& v : j["variants"]) {
    const auto& st = v["sender_stages_ms"];
    const auto& rc = v["receiver_ms"];
    std::printf(
        "%-13s %6lld %6.1f %5.0f %-9s %7.2f %5.2f %5.2f %4.0f%% %5.2f %4.0f%% "
        "| ",
        j["shape"].get<std::string>().c_str(), j["tokens"].get<long long>(),
        j["bytes"].get<double>() / 1048576,
        j["layer_bytes"].get<double>() / 1024,
        v["variant"].get<std::string>().c_str(),
        Median(v["transfer_ms"].get<std::vector<double>>()),
        v["transfer_gbps_median"].get<double>(),
        j["loopback_ceiling_gbps"].get<double>(),
        v["transfer_pct_of_loopback"].get<double>(),
        j["loopback_region_ceiling_gbps"].get<double>(),
        v["transfer_pct_of_loopback_region"].get<double>());
    if (first) {
      std::printf("%5.2f %4.0f%% | ", j["send_only_gbps_median"].get<double>(),
                  j["send_only_pct_of_loopback"].get<double>());
    } else {
      std::printf("%11s | ", "");
    }
    std::printf("%5.2f %5.2f %6.2f %5.2f | %5.2f %6.2f %6.2f",
                st["connect"].get<double>(), st["chunks"].get<double>(),
                st["send_layer"].get<double>(), st["finish"].get<double>(),
                rc["first_frame"].get<double>(), rc["last_layer"].get<double>(),
                rc["done"].get<double>());
    if (first) {
      std::printf(" | %5.1f %5.1f %5.1f %5.1f", iso["export"].get<double>(),
                  iso["checksum"].get<double>(), iso["import"].get<double>(),
                  iso["memcpy"].get<double>());
    }
    std::printf("\n");
    first = false;
  }
  std::fflush(stdout);
}

}  // namespace

void RunRaw(const std::vector<Shape>& shapes,
            const std::vector<int64_t>& token_counts, const RawOptions& options,
            Json& out) {
  const int repeats = std::max(1, options.repeats);
  cpu_set_t unpinned;  // restored at the end: later phases use every core
  pthread_getaffinity_np(pthread_self(), sizeof(unpinned), &unpinned);
  bench::PinCurrentThread(options.sender_cpu);
  LoopbackFigures large;
  for (int r = 0; r < repeats; ++r) {
    MeasureLoopback(64 << 20, 0, options, &large);
  }
  out["loopback_64MiB"] = {{"autotuned_gbps", large.autotuned},
                           {"fixed_buffer_gbps", large.fixed}};
  std::printf(
      "loopback TCP, 64 MiB messages: %.2f GB/s autotuned buffers, %.2f GB/s "
      "%d KiB buffers (median of %d)\n\n",
      Median(large.autotuned), Median(large.fixed),
      options.loopback_fixed_buffer / 1024, repeats);
  std::printf(
      "raw KV transfer, median of %d (GB/s = 1e9 bytes/s; ceilings = loopback "
      "with messages of the layer size, best of autotuned / fixed buffers and "
      "whole-message / 256 KiB receives: ceil from one resident buffer at each "
      "end, foot from source and "
      "destination regions of the cache's size; sender and receiver ms from "
      "the sender's start)\n",
      repeats);
  std::printf(
      "%-13s %6s %6s %5s %-9s %7s %5s %5s %5s %5s %5s | %-11s | %-26s | %-20s "
      "| %s\n",
      "shape", "tokens", "MiB", "KiB/l", "variant", "ms", "GB/s", "ceil",
      "%ceil", "foot", "%foot", "send-only", "sender: conn lst send fin",
      "recv: 1st last done", "alone: exp sum imp cpy");
  for (const Shape& shape : shapes) {
    for (int64_t n : token_counts) {
      Json j = RawCase(shape, n, options);
      PrintRaw(j);
      out["raw"].push_back(j);
    }
  }
  pthread_setaffinity_np(pthread_self(), sizeof(unpinned), &unpinned);
}

}  // namespace baton::kvbench
