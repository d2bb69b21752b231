// Benchmarks the CPU MatMul kernels on SmolLM2-135M's shapes (hidden 576,
// FFN 1536, 3 KV heads of 64, vocab 49152; Q4_1 linear layers, Q8_0 tied
// output projection): DRAM read bandwidth, GEMV (decode) time against that
// bandwidth, and GEMM (prefill / batched decode) GFLOP/s.
// Every number is the best of several runs; the machine may be shared.
//
// Usage: matmul_bench [--reps=N] [--isa=scalar|avx2|avx512vnni]
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/common/memory_bandwidth.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace baton {
namespace {

constexpr int64_t kHidden = 576, kKv = 192, kFfn = 1536, kVocab = 49152;
constexpr int kLayers = 30;

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

using bench::BestSeconds;
using bench::ReadBandwidthGBs;

// A set of random weights of one shape and type.
struct WeightSet {
  std::vector<uint8_t> bytes;
  std::vector<TensorView> views;
  uint64_t bytes_each = 0;
};

WeightSet MakeWeights(DType dtype, int64_t rows, int64_t k, int copies,
                      uint32_t seed) {
  const DTypeInfo& info = GetDTypeInfo(dtype);
  WeightSet set;
  set.bytes_each = rows * (k / info.block_size) * info.block_bytes;
  set.bytes.resize(set.bytes_each * copies);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < set.bytes.size(); i += 4) {
    const uint32_t v = rng();
    std::memcpy(&set.bytes[i], &v, std::min<size_t>(4, set.bytes.size() - i));
  }
  // Keep every f16 scale / min finite and small: 0x2000 | random low bits.
  if (dtype != DType::kF32 && dtype != DType::kF16) {
    for (uint64_t b = 0; b < set.bytes.size(); b += info.block_bytes) {
      set.bytes[b + 1] = 0x20;
      if (dtype == DType::kQ4_1) set.bytes[b + 3] = 0xa0;
    }
  } else {
    for (size_t i = 0; i < set.bytes.size(); i += info.block_bytes) {
      set.bytes[i + info.block_bytes - 1] &= 0x3b;  // finite, |v| small
    }
  }
  for (int c = 0; c < copies; ++c) {
    TensorView v;
    v.name = "bench";
    v.dtype = dtype;
    v.shape = {rows, k};
    v.data = set.bytes.data() + c * set.bytes_each;
    v.nbytes = set.bytes_each;
    set.views.push_back(v);
  }
  return set;
}

std::vector<float> RandomInput(int64_t n) {
  std::mt19937 rng(5);
  std::normal_distribution<float> d;
  std::vector<float> x(n);
  for (float& v : x) v = d(rng);
  return x;
}

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "MatMul failed: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

struct Shape {
  const char* name;
  DType dtype;
  int64_t rows, k;
};

// The model's linear layers, applied in order with shared inputs as the
// engine does: (q, k, v) share x, (gate, up) share x.
struct Model {
  WeightSet q, k, v, o, gate, up, down, out;
  uint64_t LayerBytes() const {
    return q.bytes_each + k.bytes_each + v.bytes_each + o.bytes_each +
           gate.bytes_each + up.bytes_each + down.bytes_each;
  }
};

void RunLayers(Model& m, int64_t tokens, bool output, ThreadPool* pool,
               const MatMulOptions& opt, const std::vector<float>& xh,
               const std::vector<float>& xf, std::vector<float>& y) {
  MatMulInput in;
  for (int l = 0; l < kLayers; ++l) {
    in.Reset(xh.data(), tokens, kHidden);
    Check(MatMul(m.q.views[l], in, y.data(), pool, opt));
    Check(MatMul(m.k.views[l], in, y.data(), pool, opt));
    Check(MatMul(m.v.views[l], in, y.data(), pool, opt));
    Check(MatMul(m.o.views[l], xh.data(), tokens, y.data(), pool, opt));
    in.Reset(xh.data(), tokens, kHidden);
    Check(MatMul(m.gate.views[l], in, y.data(), pool, opt));
    Check(MatMul(m.up.views[l], in, y.data(), pool, opt));
    Check(MatMul(m.down.views[l], xf.data(), tokens, y.data(), pool, opt));
  }
  if (output)
    Check(MatMul(m.out.views[0], xh.data(), tokens, y.data(), pool, opt));
}

int Main(int argc, char** argv) {
  int reps = 5;
  MatMulOptions opt;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--reps=", 0) == 0)
      reps = std::max(1, std::atoi(a.c_str() + 7));
    if (a.rfind("--isa=", 0) == 0) {
      absl::StatusOr<CpuIsa> isa = ParseCpuIsa(a.substr(6));
      if (!isa.ok() || !IsCpuIsaSupported(*isa)) {
        std::fprintf(stderr, "bad or unsupported --isa\n");
        return 2;
      }
      opt.isa = *isa;
    }
  }
  std::printf(
      "kernel path: %s; best of %d runs per number (re-measure on a quiet "
      "machine)\n",
      std::string(CpuIsaName(opt.isa)).c_str(), reps);

  std::unique_ptr<ThreadPool> pools[2];
  for (int t = 0; t < 2; ++t) {
    ThreadPoolOptions po;
    po.num_threads = t + 1;
    pools[t] = std::move(ThreadPool::Create(po)).value();
  }

  {
    std::vector<double> us;
    for (int i = 0; i < 5000; ++i) {
      const double t0 = Now();
      pools[1]->ParallelFor(2, [](int64_t, int64_t) {});
      us.push_back((Now() - t0) * 1e6);
    }
    std::sort(us.begin(), us.end());
    std::printf(
        "ParallelFor(2 threads) empty job: min %.2f us, median %.2f us\n",
        us.front(), us[us.size() / 2]);
  }

  double bw[2];
  std::printf("\n(a) DRAM read bandwidth (1 GiB, %s loads)\n",
              GetCpuFeatures().avx512f ? "AVX-512" : "AVX2");
  for (int t = 0; t < 2; ++t) {
    bw[t] = ReadBandwidthGBs(pools[t].get(), reps);
    std::printf("  threads %d: %7.2f GB/s\n", t + 1, bw[t]);
  }

  // (b) GEMV. "cold": cycle through enough copies (>= 256 MiB) that every
  // call reads its weights from DRAM, as a decode step does.
  std::printf(
      "\n(b) GEMV, tokens = 1 (cold = weights from DRAM, hot = from cache)\n");
  std::printf("  %-22s %8s | %-31s | %-31s\n", "shape", "MiB",
              "1 thread: cold us  GB/s  hot us",
              "2 threads: cold us  GB/s  hot us");
  const Shape shapes[] = {
      {"q/o 576x576 Q4_1", DType::kQ4_1, kHidden, kHidden},
      {"k/v 192x576 Q4_1", DType::kQ4_1, kKv, kHidden},
      {"gate/up 1536x576 Q4_1", DType::kQ4_1, kFfn, kHidden},
      {"down 576x1536 Q4_1", DType::kQ4_1, kHidden, kFfn},
      {"out 49152x576 Q8_0", DType::kQ8_0, kVocab, kHidden},
      {"576x576 Q8_0", DType::kQ8_0, kHidden, kHidden},
      {"576x576 Q4_0", DType::kQ4_0, kHidden, kHidden},
      {"576x576 F16", DType::kF16, kHidden, kHidden},
      {"576x576 F32", DType::kF32, kHidden, kHidden}};
  std::vector<float> y(int64_t{512} * kVocab);
  const std::vector<float> x = RandomInput(int64_t{512} * kFfn);
  for (const Shape& s : shapes) {
    const DTypeInfo& info = GetDTypeInfo(s.dtype);
    const uint64_t each = s.rows * (s.k / info.block_size) * info.block_bytes;
    const int copies =
        static_cast<int>(std::max<uint64_t>(2, (256ull << 20) / each));
    WeightSet set = MakeWeights(s.dtype, s.rows, s.k, copies, 1);
    std::printf("  %-22s %8.3f |", s.name, each / 1048576.0);
    for (int t = 0; t < 2; ++t) {
      const double cold =
          BestSeconds(reps,
                      [&] {
                        for (int c = 0; c < copies; ++c) {
                          Check(MatMul(set.views[c], x.data(), 1, y.data(),
                                       pools[t].get(), opt));
                        }
                      }) /
          copies;
      const int hot_iters = std::max(1, copies / 4);
      const double hot =
          BestSeconds(reps,
                      [&] {
                        for (int c = 0; c < hot_iters; ++c) {
                          Check(MatMul(set.views[0], x.data(), 1, y.data(),
                                       pools[t].get(), opt));
                        }
                      }) /
          hot_iters;
      std::printf(" %12.1f %6.1f %8.1f   |", cold * 1e6, each / cold / 1e9,
                  hot * 1e6);
    }
    std::printf("\n");
  }

  Model m{MakeWeights(DType::kQ4_1, kHidden, kHidden, kLayers, 11),
          MakeWeights(DType::kQ4_1, kKv, kHidden, kLayers, 12),
          MakeWeights(DType::kQ4_1, kKv, kHidden, kLayers, 13),
          MakeWeights(DType::kQ4_1, kHidden, kHidden, kLayers, 14),
          MakeWeights(DType::kQ4_1, kFfn, kHidden, kLayers, 15),
          MakeWeights(DType::kQ4_1, kFfn, kHidden, kLayers, 16),
          MakeWeights(DType::kQ4_1, kHidden, kFfn, kLayers, 17),
          MakeWeights(DType::kQ8_0, kVocab, kHidden, 1, 18)};
  const uint64_t step_bytes = m.LayerBytes() * kLayers + m.out.bytes_each;
  const double step_macs =
      static_cast<double>(kLayers * (2 * kHidden * kHidden + 2 * kKv * kHidden +
                                     3 * kFfn * kHidden) +
                          kVocab * kHidden);
  std::printf(
      "\n    decode step = 30 x (q,k,v,o,gate,up,down) + output: %.1f MiB of "
      "weights\n",
      step_bytes / 1048576.0);
  for (int t = 0; t < 2; ++t) {
    const double s = BestSeconds(
        reps * 2, [&] { RunLayers(m, 1, true, pools[t].get(), opt, x, x, y); });
    const double ceiling = bw[t] * 1e9 / step_bytes;
    std::printf(
        "  threads %d: step %.2f ms = %.1f tok/s (matmuls only); ceiling %.1f "
        "tok/s "
        "at %.2f GB/s -> %.0f%%; effective %.2f GB/s\n",
        t + 1, s * 1e3, 1 / s, ceiling, bw[t], 100.0 / s / ceiling,
        step_bytes / s / 1e9);
  }

  std::printf(
      "\n(c) GEMM (30 layers of q,k,v,o,gate,up,down, Q4_1; no output "
      "projection)\n");
  const double layer_macs = static_cast<double>(step_macs - kVocab * kHidden);
  for (int64_t tokens : {1, 8, 32, 128, 512}) {
    std::printf("  tokens %4lld:", static_cast<long long>(tokens));
    for (int t = 0; t < 2; ++t) {
      const int r = tokens >= 128 ? std::max(2, reps / 2) : reps;
      const double s = BestSeconds(r, [&] {
        RunLayers(m, tokens, false, pools[t].get(), opt, x, x, y);
      });
      std::printf("   %d thr: %8.2f ms %7.1f GFLOP/s %8.1f tok/s", t + 1,
                  s * 1e3, 2 * layer_macs * tokens / s / 1e9, tokens / s);
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) { return baton::Main(argc, argv); }
