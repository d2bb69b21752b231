// Host KV transfer over loopback TCP against this machine's loopback TCP
// bandwidth, measured in the same run (see docs/performance.md):
//   - loopback ceiling: one socket pair on 127.0.0.1, messages of each
//     case's per-layer payload size (and one large size), with the kernel's
//     autotuned buffers (as the transport uses) and with large fixed ones;
//   - raw transfer (kv_raw.h): a KvCache holding N tokens at a model's
//     layout, sent layer by layer from the pool as the engine's handoff does
//     (chunk list, TcpKvSender::SendLayerChunks hashing each chunk as it
//     goes out) to a TcpKvReceiver that receives straight into reserved
//     blocks of a second KvCache and checksums them in place; timed stage by
//     stage on both sides; also "send only" (contiguous payloads exported
//     and checksummed beforehand) and the cost of each copy on its own;
//   - overlap (kv_overlap.h): a split prefill between two engines in this
//     process over loopback TCP.
//
//   build/bin/kv_transfer_bench --json=/tmp/kv_transfer.json
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/kv_bench_util.h"
#include "bench/kv_overlap.h"
#include "bench/kv_raw.h"
#include "common/test_util.h"
#include "model/synth/shapes.h"
#include "model/synth/synth_model.h"
#include "model/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "worker/engine/model_weights.h"

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
ABSL_FLAG(bool, pin, true,
          "raw transfers and loopback ceilings: senders on CPU 0, receivers "
          "on CPU 1 (as two workers on two cores), so each run does not "
          "depend on where the scheduler happens to put the threads");
ABSL_FLAG(std::string, variants,
          "pooled:2048:0:pooled,fresh:2048:0,pooled_1m:1024:0:pooled,"
          "tls:2048:0:pooled:tls",
          "transport configurations of the raw transfer, measured "
          "alternately: name:send_call_KiB:socket_buffer_KiB[:pooled][:tls],"
          "... (socket buffer 0 = kernel autotuning; pooled = connections "
          "reused through a TcpKvConnectionPool, as workers do; tls = both "
          "ends TLS, as with baton-worker --kv_tls)");

namespace baton::kvbench {
namespace {

using Json = nlohmann::json;

std::vector<RawVariant> ParseVariants(const std::string& s) {
  std::vector<RawVariant> out;
  for (absl::string_view item : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    const std::vector<std::string> f = absl::StrSplit(item, ':');
    int64_t call_kib = 0, buffer_kib = 0;
    bool ok = f.size() >= 3 && f.size() <= 5 && !f[0].empty() &&
              absl::SimpleAtoi(f[1], &call_kib) &&
              absl::SimpleAtoi(f[2], &buffer_kib) && call_kib >= 0 &&
              buffer_kib >= 0;
    RawVariant v{f[0], static_cast<size_t>(call_kib) << 10,
                 static_cast<int>(buffer_kib << 10)};
    for (size_t i = 3; ok && i < f.size(); ++i) {
      if (f[i] == "pooled" && !v.pooled) {
        v.pooled = true;
      } else if (f[i] == "tls" && !v.tls) {
        v.tls = true;
      } else {
        ok = false;
      }
    }
    if (!ok) {
      Die("--variants",
          absl::InvalidArgumentError("each entry must be "
                                     "name:send_call_KiB:buffer_KiB[:pooled]"
                                     "[:tls]"));
    }
    out.push_back(v);
  }
  if (out.empty()) out.push_back(RawVariant{"default"});
  return out;
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

  if (absl::GetFlag(FLAGS_raw)) {
    RawOptions ro;
    ro.repeats = repeats;
    ro.loopback_bytes = absl::GetFlag(FLAGS_loopback_bytes);
    ro.loopback_fixed_buffer = absl::GetFlag(FLAGS_socket_buffer);
    ro.variants = ParseVariants(absl::GetFlag(FLAGS_variants));
    if (absl::GetFlag(FLAGS_pin) && std::thread::hardware_concurrency() >= 2) {
      ro.sender_cpu = 0;
      ro.receiver_cpu = 1;
    }
    RunRaw(shapes, token_counts, ro, out);
  }

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
          OverlapOptions oo;
          oo.prompt_tokens = n;
          oo.chunk_tokens = chunk;
          oo.threads = threads;
          oo.repeats = orep;
          oo.baseline = absl::GetFlag(FLAGS_overlap_baseline);
          Json j = OverlapCase(shape, *w, *tok, oo);
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
}  // namespace baton::kvbench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return baton::kvbench::Main();
}
