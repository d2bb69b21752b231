// Engine throughput against the machine's limits and llama.cpp, in one run:
//   - DRAM read bandwidth (vectorised read loop) and the decode ceiling it
//     implies: bandwidth / bytes read per decode step;
//   - Baton decode tokens/s at batch 1, 8 and 32 (greedy, sampling and
//     scheduling included) and prefill tokens/s for 128- and 1024-token
//     prompts;
//   - llama.cpp's figures on the same file and thread count
//     (bench/llama_cpp_bench.py via llama-cpp-python), as ratios;
//   - for each prompt length, the rate of the model's own linear layers
//     alone (the quantized GEMM kernels on its matrices, that many tokens,
//     random inputs), and prefill's linear FLOPs per second as a share of
//     it: what attention, norms, RoPE and scheduling cost on top;
//   - for each decode batch above 1, the tokens/s a decode step's matmuls
//     alone allow at that batch (every layer's matrices and the output
//     projection): the bound batching meets once the weights are no longer
//     the bottleneck;
//   - with several thread counts (--threads=1,2), a table each and the
//     speedup of the last count over the first.
//
//   build/bin/engine_bench --model=models/SmolLM2-135M-Instruct.Q4_1.gguf
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/common/memory_bandwidth.h"
#include "common/test_util.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "model/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "worker/engine/engine.h"

ABSL_FLAG(std::string, model, "", "GGUF model (default: the default model)");
ABSL_FLAG(std::string, threads, "0",
          "compute thread counts, comma-separated (1,2: a table each and the "
          "speedup); 0 = all cores");
ABSL_FLAG(std::string, batches, "1,8,32", "decode batch sizes");
ABSL_FLAG(std::string, prompt_lens, "128,1024", "prefill prompt lengths");
ABSL_FLAG(int, decode_tokens, 64, "decode steps measured per batch");
ABSL_FLAG(int, reps, 3, "repetitions; the best is reported");
ABSL_FLAG(bool, llama_cpp, true, "also measure llama.cpp (llama-cpp-python)");
ABSL_FLAG(bool, repack, true,
          "repack Q4_K, Q6_K and Q5_0 matrices for the quantized kernels; "
          "false loads them as f32 (as before the repacked layouts), an A/B");

namespace baton {
namespace {

using Seconds = std::chrono::duration<double>;

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> out;
  for (absl::string_view v : absl::StrSplit(s, ',')) {
    int x;
    if (absl::SimpleAtoi(v, &x) && x > 0) out.push_back(x);
  }
  return out;
}

std::vector<int32_t> Prompt(int64_t n, int64_t salt, int64_t vocab) {
  std::vector<int32_t> p(n);
  for (int64_t i = 0; i < n; ++i) {
    p[i] =
        static_cast<int32_t>(100 + (salt * 7919 + i * 104729) %
                                       (std::min<int64_t>(vocab, 40000) - 200));
  }
  return p;
}

// Decode tokens/s of `batch` sequences stepping together after their
// prefills: batch * decode_tokens / (time from the last first token to the
// end).
double DecodeRate(const ModelWeights& w, const Tokenizer& t, int threads,
                  int batch, int decode_tokens) {
  EngineOptions o;
  o.num_threads = threads;
  o.kv_cache_blocks = batch * ((32 + decode_tokens + 1) / 16 + 2);
  o.scheduler.max_num_batched_tokens = 2048;
  auto engine = Engine::Create(o, &w, &t);
  if (!engine.ok()) return 0;
  int first_tokens = 0;
  Clock::time_point all_started;
  for (int b = 0; b < batch; ++b) {
    SamplingParams p;
    p.temperature = 0;
    p.ignore_eos = true;
    p.max_tokens = decode_tokens + 1;
    auto s = (*engine)->Submit(
        {std::to_string(b), Prompt(32, b, w.config().vocab_size), p},
        [&](const RequestOutput& out) {
          if (!out.tokens.empty() && out.metrics.generated_tokens == 0 &&
              ++first_tokens == batch) {
            all_started = Clock::now();
          }
        });
    if (!s.ok()) return 0;
  }
  while (first_tokens < batch) (*engine)->Step();
  (*engine)->RunUntilIdle();
  return batch * decode_tokens / Seconds(Clock::now() - all_started).count();
}

// Prompt tokens/s of one prompt of n tokens (time to its first token).
double PrefillRate(const ModelWeights& w, const Tokenizer& t, int threads,
                   int n) {
  EngineOptions o;
  o.num_threads = threads;
  o.kv_cache_blocks = n / 16 + 4;
  o.scheduler.max_num_batched_tokens = n;
  auto engine = Engine::Create(o, &w, &t);
  if (!engine.ok()) return 0;
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 1;
  double ttft = 0;
  auto s = (*engine)->Submit({"p", Prompt(n, 1, w.config().vocab_size), p},
                             [&](const RequestOutput& out) {
                               if (out.finish_reason != FinishReason::kNone) {
                                 ttft = out.metrics.ttft_s();
                               }
                             });
  if (!s.ok()) return 0;
  (*engine)->RunUntilIdle();
  return ttft > 0 ? n / ttft : 0;
}

// A layer's linear matrices.
std::array<const TensorView*, 7> LinearMatrices(const LayerWeights& l) {
  return {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down};
}

// Multiply-accumulates of one token through every layer's linear matrices
// (not the output projection: a prefill computes logits for its last token
// only).
double LinearMacsPerToken(const ModelWeights& w) {
  double macs = 0;
  for (const LayerWeights& l : w.layers()) {
    for (const TensorView* m : LinearMatrices(l)) {
      macs +=
          static_cast<double>(m->shape[0]) * static_cast<double>(m->shape[1]);
    }
  }
  return macs;
}

// Best seconds of `tokens` tokens through every layer's linear matrices
// (and the output projection when `with_output`): the GEMM kernels alone,
// random inputs, best of `reps`. 0 on an error.
double MatmulSeconds(const ModelWeights& w, ThreadPool* pool, int64_t tokens,
                     int reps, bool with_output) {
  std::vector<const TensorView*> matrices;
  for (const LayerWeights& l : w.layers()) {
    for (const TensorView* m : LinearMatrices(l)) matrices.push_back(m);
  }
  if (with_output) matrices.push_back(&w.output());
  int64_t widest = 0;
  for (const TensorView* m : matrices) {
    widest = std::max({widest, m->shape[0], m->shape[1]});
  }
  std::vector<float> x(static_cast<size_t>(tokens * widest));
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<float>(static_cast<int64_t>(i * 2654435761u % 2001) -
                              1000) *
           1e-3f;
  }
  std::vector<float> y(x.size());
  double best = 1e30;
  for (int r = 0; r < std::max(2, reps); ++r) {
    const auto start = Clock::now();
    for (const TensorView* m : matrices) {
      if (!MatMul(*m, x.data(), tokens, y.data(), pool, {}).ok()) return 0;
    }
    best = std::min(best, Seconds(Clock::now() - start).count());
  }
  return best;
}

// GFLOP/s of the model's linear layers at `tokens` tokens.
double LinearGflops(const ModelWeights& w, ThreadPool* pool, int64_t tokens,
                    int reps) {
  const double s = MatmulSeconds(w, pool, tokens, reps, false);
  return s > 0
             ? 2 * LinearMacsPerToken(w) * static_cast<double>(tokens) / s / 1e9
             : 0;
}

// Decode tokens/s that a step's matmuls alone allow at batch `batch`.
double DecodeMatmulBound(const ModelWeights& w, ThreadPool* pool, int batch,
                         int reps) {
  const double s = MatmulSeconds(w, pool, batch, reps, true);
  return s > 0 ? batch / s : 0;
}

// One thread count's figures. Rates in tokens/s; llama.cpp's 0 when not
// measured.
struct Row {
  int size = 0;        // batch or prompt length
  double baton = 0;    // Baton
  double llama = 0;    // llama.cpp, same file and threads
  double matmuls = 0;  // decode: tokens/s its matmuls allow at this batch;
                       // prefill: GFLOP/s of the linear layers alone
};
struct Figures {
  int threads = 0;
  std::vector<Row> decode, prefill;
};

// Thread counts from "1,2" (0 = all cores); false on a bad entry.
bool ParseThreads(const std::string& s, std::vector<int>* out) {
  for (absl::string_view v : absl::StrSplit(s, ',')) {
    int x;
    if (!absl::SimpleAtoi(v, &x) || x < 0 || x > 1024) return false;
    out->push_back(
        x > 0 ? x : static_cast<int>(std::thread::hardware_concurrency()));
  }
  return !out->empty();
}

// llama.cpp's figures at `threads` (bench/llama_cpp_bench.py), or null.
nlohmann::json LlamaCpp(const std::string& model, int threads, int reps,
                        int decode_tokens) {
  auto out = testing::RunCommand(
      testing::PythonPath() + " " + testing::SourceDir() +
      "/bench/llama_cpp_bench.py --model " + model + " --threads " +
      std::to_string(threads) + " --batches " + absl::GetFlag(FLAGS_batches) +
      " --prompt_lens " + absl::GetFlag(FLAGS_prompt_lens) +
      " --decode_tokens " + std::to_string(decode_tokens) + " --reps " +
      std::to_string(reps));
  if (!out.ok()) {
    std::fprintf(stderr, "llama.cpp run failed: %s\n",
                 out.status().ToString().c_str());
    return nullptr;
  }
  return nlohmann::json::parse(*out, nullptr, false);
}

Figures Measure(const ModelWeights& w, const Tokenizer& t,
                const std::string& model, int threads, int reps,
                int decode_tokens) {
  Figures f;
  f.threads = threads;
  nlohmann::json llama;
  if (absl::GetFlag(FLAGS_llama_cpp)) {
    llama = LlamaCpp(model, threads, reps, decode_tokens);
  }
  auto llama_rate = [&](const char* kind, int key) -> double {
    if (!llama.is_object() || !llama.contains(kind)) return 0;
    auto it = llama[kind].find(std::to_string(key));
    return it == llama[kind].end() ? 0 : it->get<double>();
  };
  ThreadPoolOptions po;
  po.num_threads = threads;
  auto pool = ThreadPool::Create(po);
  for (int b : ParseList(absl::GetFlag(FLAGS_batches))) {
    Row r{b, 0, llama_rate("decode", b), 0};
    for (int i = 0; i < reps; ++i) {
      r.baton = std::max(r.baton, DecodeRate(w, t, threads, b, decode_tokens));
    }
    if (b > 1) r.matmuls = DecodeMatmulBound(w, pool->get(), b, reps);
    f.decode.push_back(r);
  }
  for (int n : ParseList(absl::GetFlag(FLAGS_prompt_lens))) {
    Row r{n, 0, llama_rate("prefill", n), 0};
    for (int i = 0; i < reps; ++i) {
      r.baton = std::max(r.baton, PrefillRate(w, t, threads, n));
    }
    r.matmuls = LinearGflops(w, pool->get(), n, reps);
    f.prefill.push_back(r);
  }
  return f;
}

void PrintTable(const Figures& f, double macs, double ceiling) {
  std::printf("\nthreads: %d\n", f.threads);
  std::printf("%-22s %12s %12s %8s %10s\n", "", "Baton tok/s", "llama.cpp",
              "ratio", "ceiling %");
  std::printf("%-22s %12s %12s %8s %10s\n", "", "", "", "", "GEMM peak %");
  double batch1 = 0;
  for (const Row& r : f.decode) {
    if (r.size == 1) batch1 = r.baton;
    std::printf("%-22s %12.1f %12.1f %8.2f %9.0f%%",
                ("decode, batch " + std::to_string(r.size)).c_str(), r.baton,
                r.llama, r.llama > 0 ? r.baton / r.llama : 0,
                100 * r.baton / r.size / ceiling);
    if (r.size != 1 && batch1 > 0) {
      std::printf("   %.2fx batch 1; its matmuls alone: %.1f tok/s (%.2fx)",
                  r.baton / batch1, r.matmuls, r.matmuls / batch1);
    }
    std::printf("\n");
  }
  for (const Row& r : f.prefill) {
    const double used = 2 * macs * r.baton / 1e9;
    std::printf(
        "%-22s %12.1f %12.1f %8.2f %9.0f%%   %.1f of %.1f GFLOP/s (linear "
        "layers alone at %d tokens)\n",
        ("prefill, " + std::to_string(r.size) + " tokens").c_str(), r.baton,
        r.llama, r.llama > 0 ? r.baton / r.llama : 0,
        r.matmuls > 0 ? 100 * used / r.matmuls : 0, used, r.matmuls, r.size);
  }
}

// Last thread count over the first, row by row.
void PrintSpeedup(const Figures& a, const Figures& b) {
  std::printf("\nspeedup, %d threads over %d%s\n", b.threads, a.threads,
              absl::GetFlag(FLAGS_llama_cpp) ? " (Baton, llama.cpp)" : "");
  auto row = [](const std::string& name, const Row& x, const Row& y) {
    std::printf("%-22s %7.2fx", name.c_str(),
                x.baton > 0 ? y.baton / x.baton : 0);
    if (x.llama > 0) std::printf(" %7.2fx", y.llama / x.llama);
    std::printf("\n");
  };
  for (size_t i = 0; i < a.decode.size() && i < b.decode.size(); ++i) {
    row("decode, batch " + std::to_string(a.decode[i].size), a.decode[i],
        b.decode[i]);
  }
  for (size_t i = 0; i < a.prefill.size() && i < b.prefill.size(); ++i) {
    row("prefill, " + std::to_string(a.prefill[i].size) + " tokens",
        a.prefill[i], b.prefill[i]);
  }
}

int Main() {
  std::string model = absl::GetFlag(FLAGS_model);
  if (model.empty()) model = testing::DefaultModelPath();
  std::vector<int> thread_counts;
  if (!ParseThreads(absl::GetFlag(FLAGS_threads), &thread_counts)) {
    std::fprintf(stderr,
                 "engine_bench: --threads=%s: expected thread counts from 0 "
                 "(all cores) to 1024, comma-separated\n",
                 absl::GetFlag(FLAGS_threads).c_str());
    return 1;
  }
  const int reps = absl::GetFlag(FLAGS_reps);
  const int decode_tokens = absl::GetFlag(FLAGS_decode_tokens);
  ModelWeightsOptions load;
  load.repack = absl::GetFlag(FLAGS_repack);
  auto weights = ModelWeights::Open(model, load);
  if (!weights.ok()) {
    std::fprintf(stderr, "engine_bench: %s\n",
                 weights.status().ToString().c_str());
    return 1;
  }
  auto tokenizer = Tokenizer::FromGguf(*(*weights)->gguf());
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "engine_bench: %s\n",
                 tokenizer.status().ToString().c_str());
    return 1;
  }
  const ModelConfig& c = (*weights)->config();
  std::printf(
      "model: %s (%s, %lld layers, hidden %lld); matrices %.1f MiB as loaded "
      "(Q4_K, Q6_K, Q5_0 %s)\n",
      model.c_str(), c.name.c_str(), (long long)c.num_layers,
      (long long)c.hidden_size, (*weights)->matrix_bytes() / 1048576.0,
      load.repack ? "repacked" : "as f32");
  const CpuFeatures& f = GetCpuFeatures();
  std::printf(
      "CPU: %s; detected: avx2 %d fma %d f16c %d avx512f %d avx512bw %d "
      "avx512vl %d avx512vnni %d\n",
      CpuModelName().c_str(), f.avx2, f.fma, f.f16c, f.avx512f, f.avx512bw,
      f.avx512vl, f.avx512vnni);
  std::printf("kernel path: %s\n",
              std::string(CpuIsaName(BestCpuIsa())).c_str());

  ThreadPoolOptions po;
  po.num_threads =
      *std::max_element(thread_counts.begin(), thread_counts.end());
  auto pool = ThreadPool::Create(po);
  // This machine's bandwidth varies run to run (shared host): measured
  // before and after the engine runs; the higher figure sets the ceiling.
  const double bw_before = bench::ReadBandwidthGBs(pool->get(), 5);
  std::vector<Figures> figures;
  for (int threads : thread_counts) {
    figures.push_back(
        Measure(**weights, **tokenizer, model, threads, reps, decode_tokens));
  }
  const double bw_after = bench::ReadBandwidthGBs(pool->get(), 5);
  const double bw = std::max(bw_before, bw_after);
  // Per decode step: every matrix once, one embedding row, and (negligible
  // at these lengths) the KV cache.
  const double step_bytes = static_cast<double>((*weights)->matrix_bytes());
  const double ceiling = bw * 1e9 / step_bytes;
  std::printf(
      "memory read bandwidth (%d threads): %.1f GB/s before, %.1f GB/s after "
      "the runs; bytes per decode step %.1f MiB; decode ceiling %.0f "
      "tokens/s\n",
      po.num_threads, bw_before, bw_after, step_bytes / 1048576.0, ceiling);
  const double macs = LinearMacsPerToken(**weights);
  for (const Figures& fig : figures) PrintTable(fig, macs, ceiling);
  if (figures.size() > 1) PrintSpeedup(figures.front(), figures.back());
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return baton::Main();
}
