// Throughput of CudaModelRunner on a synthetic Llama-3-8B (model/synth,
// seeded random Q4_1 weights, bf16 on the device) against ceilings measured
// in the same run: decode tokens/s at several batch sizes over a cached
// context, as a fraction of the HBM bandwidth (bytes of weights + KV read
// per step / step time), and prefill tokens/s of one long prompt, as a
// fraction of the dense bf16 GEMM rate. Decode runs through CUDA graphs
// (the runner's default) and again eagerly (rows marked "eager"), so the
// launch overhead the graphs save is visible.
//
//   cuda_forward_bench [--model=/tmp/x.gguf] [--decode_batches=1,64] ...
//
// Exits with status 1 and a message when no CUDA device is usable.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "model/synth/shapes.h"
#include "model/synth/synth_model.h"
#include "worker/cuda/cuda_bench_ceilings.h"
#include "worker/cuda/cuda_model_runner.h"

ABSL_FLAG(std::string, model, "/tmp/baton_cuda_bench_llama-3-8b.gguf",
          "GGUF model to run; written first from --shape (Q4_1, seeded "
          "random weights, ~4.5 GB for llama-3-8b) when the file is missing");
ABSL_FLAG(std::string, shape, "llama-3-8b",
          "synthetic shape (model/synth/shapes.h) written when --model is "
          "missing");
ABSL_FLAG(int, device, 0, "CUDA device index");
ABSL_FLAG(int64_t, context, 512,
          "tokens already cached per sequence before the decode steps");
ABSL_FLAG(std::string, decode_batches, "1,64",
          "comma-separated decode batch sizes");
ABSL_FLAG(int, decode_steps, 32, "timed decode steps per batch size");
ABSL_FLAG(int, warmup_steps, 3, "untimed steps before each measurement");
ABSL_FLAG(int64_t, prefill_tokens, 2048, "tokens of the prefill prompt");
ABSL_FLAG(int, prefill_repeats, 3, "timed prefills (the best counts)");
ABSL_FLAG(int64_t, hbm_bytes, int64_t{2} << 30,
          "bytes of the device-to-device copy measuring HBM bandwidth");
ABSL_FLAG(int64_t, gemm_size, 8192, "m = n = k of the bf16 GEMM ceiling");

namespace baton {
namespace {

using Clock = std::chrono::steady_clock;

void Must(const absl::Status& status, const char* what) {
  if (status.ok()) return;
  std::fprintf(stderr, "cuda_forward_bench: %s: %s\n", what,
               status.ToString().c_str());
  std::exit(1);
}

template <typename T>
T Must(absl::StatusOr<T> value, const char* what) {
  Must(value.status(), what);
  return std::move(*value);
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct DecodeResult {
  int64_t batch = 0;
  bool eager = false;  // graphs off
  double step_ms = 0;
  double tokens_per_s = 0;
  double bytes_per_step = 0;  // weights + KV read
  double achieved_gbps = 0;
};

// Decode steps over `batch` sequences that hold `context` tokens each. The
// cached K/V are the pool's zeros: a step's cost does not depend on them.
DecodeResult MeasureDecode(CudaModelRunner& runner, KvCache& allocator,
                           int64_t batch, int64_t context, int warmup,
                           int steps) {
  const ModelConfig& c = runner.config();
  std::vector<BlockTable> tables(batch);
  std::vector<int32_t> tokens(batch);
  for (int64_t b = 0; b < batch; ++b) {
    Must(allocator.Reserve(tables[b], context + warmup + steps), "reserve");
    Must(allocator.SetNumTokens(tables[b], context), "set tokens");
    tokens[b] = static_cast<int32_t>((b * 7919 + 13) % c.vocab_size);
  }
  std::vector<float> logits;
  std::vector<ForwardItem> items(batch);
  auto step = [&] {
    for (int64_t b = 0; b < batch; ++b) {
      items[b] = {&tables[b], tables[b].num_tokens(),
                  std::span<const int32_t>(&tokens[b], 1), LogitsMode::kLast};
    }
    Must(runner.Forward(items, &logits), "decode step");
  };
  for (int i = 0; i < warmup; ++i) step();
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < steps; ++i) step();
  const double seconds = Seconds(start, Clock::now());
  for (BlockTable& t : tables) allocator.Free(t);

  DecodeResult r;
  r.batch = batch;
  r.step_ms = 1e3 * seconds / steps;
  r.tokens_per_s = static_cast<double>(batch) * steps / seconds;
  // Keys and values of every layer over the mean context of the timed steps.
  const double mean_context = context + warmup + (steps + 1) / 2.0;
  const double kv_bytes = static_cast<double>(batch) * mean_context *
                          c.num_layers * 2.0 * c.kv_dim() * 2.0;
  r.bytes_per_step =
      static_cast<double>(runner.device_weights().matrix_bytes()) + kv_bytes;
  r.achieved_gbps = r.bytes_per_step / (seconds / steps) / 1e9;
  return r;
}

struct PrefillResult {
  int64_t tokens = 0;
  double ms = 0;
  double tokens_per_s = 0;
  double tflops = 0;  // useful FLOPs per second
};

// The best of `repeats` prefills of one `tokens`-token prompt (after one
// warm-up), next-token logits only.
PrefillResult MeasurePrefill(CudaModelRunner& runner, KvCache& allocator,
                             int64_t tokens, int repeats) {
  const ModelConfig& c = runner.config();
  std::vector<int32_t> prompt(tokens);
  for (int64_t i = 0; i < tokens; ++i) {
    prompt[i] = static_cast<int32_t>((i * 104729 + 7) % c.vocab_size);
  }
  std::vector<float> logits;
  double best = 0;
  for (int r = -1; r < repeats; ++r) {
    BlockTable table;
    Must(allocator.Reserve(table, tokens), "reserve");
    const ForwardItem item{&table, 0, prompt, LogitsMode::kLast};
    const Clock::time_point start = Clock::now();
    Must(runner.Forward({&item, 1}, &logits), "prefill");
    const double s = Seconds(start, Clock::now());
    allocator.Free(table);
    if (r >= 0 && (best == 0 || s < best)) best = s;
  }
  const double q_dim = static_cast<double>(c.num_heads) * c.head_dim;
  const double layer_params = c.hidden_size * (2.0 * q_dim + 2.0 * c.kv_dim()) +
                              3.0 * c.hidden_size * c.intermediate_size;
  const double t = static_cast<double>(tokens);
  // Projections, causal attention (QK^T and PV over t(t+1)/2 pairs), and the
  // LM head of the last row.
  const double flops = 2.0 * t * layer_params * c.num_layers +
                       4.0 * q_dim * (t * (t + 1) / 2) * c.num_layers +
                       2.0 * c.hidden_size * c.vocab_size;
  PrefillResult p;
  p.tokens = tokens;
  p.ms = best * 1e3;
  p.tokens_per_s = t / best;
  p.tflops = flops / best / 1e12;
  return p;
}

int Run() {
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::fprintf(stderr,
                 "cuda_forward_bench: no CUDA device (%s); nothing to "
                 "measure\n",
                 err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 1;
  }
  Must(CudaStatus(cudaSetDevice(absl::GetFlag(FLAGS_device)), "cudaSetDevice"),
       "device");
  cudaDeviceProp prop{};
  Must(CudaStatus(cudaGetDeviceProperties(&prop, absl::GetFlag(FLAGS_device)),
                  "cudaGetDeviceProperties"),
       "device");
  std::printf("device %d: %s, %.1f GiB\n", absl::GetFlag(FLAGS_device),
              prop.name, prop.totalGlobalMem / 1073741824.0);

  const double hbm = Must(
      MeasureHbmBandwidth(absl::GetFlag(FLAGS_hbm_bytes), 10), "HBM ceiling");
  const int64_t g = absl::GetFlag(FLAGS_gemm_size);
  const double gemm = Must(MeasureBf16GemmTflops(g, g, g, 5), "GEMM ceiling");
  std::printf(
      "HBM copy %.0f GB/s (read+write); bf16 GEMM %lld^3 %.1f "
      "TFLOP/s\n",
      hbm, static_cast<long long>(g), gemm);

  const std::string path = absl::GetFlag(FLAGS_model);
  if (!std::filesystem::exists(path)) {
    std::printf("writing %s (%s, Q4_1)...\n", path.c_str(),
                absl::GetFlag(FLAGS_shape).c_str());
    std::fflush(stdout);
    const Clock::time_point start = Clock::now();
    SynthModelOptions so;
    so.weight_type = DType::kQ4_1;
    Must(WriteSynthModel(
             Must(FindSynthShape(absl::GetFlag(FLAGS_shape)), "shape"), so,
             path, nullptr),
         "write synthetic model");
    std::printf("  written in %.1f s\n", Seconds(start, Clock::now()));
  }
  auto weights = Must(ModelWeights::Open(path), "open model");
  const ModelConfig& c = weights->config();

  std::vector<int64_t> batches;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_decode_batches),
                                            ',', absl::SkipEmpty())) {
    int64_t b = 0;
    if (!absl::SimpleAtoi(s, &b) || b < 1) {
      Must(absl::InvalidArgumentError("--decode_batches needs positive "
                                      "integers"),
           "flags");
    }
    batches.push_back(b);
  }
  const int64_t context = absl::GetFlag(FLAGS_context);
  const int warmup = std::max(0, absl::GetFlag(FLAGS_warmup_steps));
  const int steps = std::max(1, absl::GetFlag(FLAGS_decode_steps));
  const int64_t prefill = absl::GetFlag(FLAGS_prefill_tokens);
  int64_t max_batch = 1;
  for (int64_t b : batches) max_batch = std::max(max_batch, b);
  const int64_t per_seq = (context + warmup + steps + 15) / 16;
  const int64_t num_blocks =
      std::max(max_batch * per_seq, (prefill + 15) / 16) + 8;

  KvCacheOptions ko;
  ko.num_layers = c.num_layers;
  ko.num_kv_heads = c.num_kv_heads;
  ko.head_dim = c.head_dim;
  ko.block_size = 16;
  ko.num_blocks = num_blocks;
  auto allocator = Must(KvCache::Create(ko), "host block allocator");
  CudaRunnerOptions ro;
  ro.device = absl::GetFlag(FLAGS_device);
  ro.allocator = allocator.get();
  ro.max_batch_tokens = std::max(prefill, max_batch);
  const Clock::time_point load = Clock::now();
  auto runner = Must(CudaModelRunner::Create(weights.get(), allocator->layout(),
                                             num_blocks, ro),
                     "create the CUDA runner");
  std::printf(
      "%s: %lld layers, hidden %lld; %.2f GB of bf16 matrices, KV "
      "pool %.2f GB (%lld blocks); loaded in %.1f s\n",
      c.name.c_str(), static_cast<long long>(c.num_layers),
      static_cast<long long>(c.hidden_size),
      runner->device_weights().matrix_bytes() / 1e9, runner->pool_bytes() / 1e9,
      static_cast<long long>(num_blocks), Seconds(load, Clock::now()));

  std::vector<DecodeResult> decode;
  for (bool eager : {false, true}) {
    runner->set_cuda_graphs(!eager);
    for (int64_t b : batches) {
      decode.push_back(
          MeasureDecode(*runner, *allocator, b, context, warmup, steps));
      decode.back().eager = eager;
    }
  }
  runner->set_cuda_graphs(true);
  const int64_t launches = runner->graph_launches();
  std::string captured;
  for (const DecodeGraphKey& k : runner->captured_graphs()) {
    absl::StrAppend(&captured, captured.empty() ? "" : ", ", k.bucket, "/",
                    k.context_bound);
  }
  for (const auto& [k, why] : runner->graph_failures()) {
    std::printf("graph capture failed (bucket %lld, context %lld): %s\n",
                static_cast<long long>(k.bucket),
                static_cast<long long>(k.context_bound),
                why.ToString().c_str());
  }
  const PrefillResult p =
      MeasurePrefill(*runner, *allocator, prefill,
                     std::max(1, absl::GetFlag(FLAGS_prefill_repeats)));

  std::printf("\n%-34s %12s %10s %14s %10s\n", "case", "tokens/s", "ms",
              "achieved", "of ceiling");
  for (const DecodeResult& d : decode) {
    char name[64];
    std::snprintf(name, sizeof(name), "decode batch %lld ctx %lld%s",
                  static_cast<long long>(d.batch),
                  static_cast<long long>(context), d.eager ? " eager" : "");
    std::printf("%-34s %12.1f %10.2f %9.0f GB/s %9.1f%%\n", name,
                d.tokens_per_s, d.step_ms, d.achieved_gbps,
                100.0 * d.achieved_gbps / hbm);
  }
  char name[64];
  std::snprintf(name, sizeof(name), "prefill %lld tokens",
                static_cast<long long>(p.tokens));
  std::printf("%-34s %12.1f %10.2f %6.1f TFLOP/s %9.1f%%\n", name,
              p.tokens_per_s, p.ms, p.tflops, 100.0 * p.tflops / gemm);
  std::printf(
      "ceilings: HBM %.0f GB/s (device-to-device copy, read+write), "
      "bf16 GEMM %.1f TFLOP/s; decode bytes = bf16 matrices + K/V "
      "read per step\n",
      hbm, gemm);
  std::printf(
      "CUDA graphs: decode rows without \"eager\" ran %lld graph launches "
      "(a bucket's first step runs before its capture, in the warm-up); "
      "graphs captured (bucket/context tier): %s\n",
      static_cast<long long>(launches),
      captured.empty() ? "none" : captured.c_str());
  return runner->healthy() ? 0 : 1;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return baton::Run();
}
