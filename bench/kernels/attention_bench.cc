// Benchmarks the CPU paged attention kernel on every kernel path this CPU
// has, one thread: a decode step (one query over the whole context) and a
// prefill chunk (128 queries ending at the context), for SmolLM2-135M's
// shape (9 query heads on 3 KV heads of 64) and Llama-3-8B's (32 on 8 of
// 128). Prints GFLOP/s (4 x head_dim flops per query head and key: the
// scores and the weighted sum) and the ratio to the scalar path, with the
// CPU model and the best path. Every path gives the same bits
// (paged_attention_test); only speed differs. Best of --reps runs.
//
// Usage: attention_bench [--reps=N] [--context=N] [--isas=avx2,avx512vnni]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "bench/common/memory_bandwidth.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/float16.h"
#include "kernels/cpu/paged_attention.h"

namespace baton {
namespace {

struct Model {
  const char* name;
  int64_t heads, kv_heads, head_dim;
};

struct Cache {
  std::vector<uint16_t> storage;
  std::vector<const uint16_t*> k, v;
};

// One KV head group per block table; blocks of 16 in shuffled order.
Cache MakeCache(const Model& m, int64_t context) {
  constexpr int64_t kBlock = 16;
  const int64_t blocks = (context + kBlock - 1) / kBlock;
  const int64_t chunk = m.kv_heads * kBlock * m.head_dim;
  Cache c;
  c.storage.resize(static_cast<size_t>(2 * chunk * blocks));
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (uint16_t& x : c.storage) x = F32ToF16(normal(rng));
  std::vector<int64_t> ids(static_cast<size_t>(blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  for (int64_t id : ids) {
    c.k.push_back(c.storage.data() + 2 * chunk * id);
    c.v.push_back(c.storage.data() + 2 * chunk * id + chunk);
  }
  return c;
}

int Run(int reps, int64_t context, const std::vector<CpuIsa>& isas) {
  std::printf("CPU: %s; best kernel path: %s; one thread, context %lld\n",
              CpuModelName().c_str(),
              std::string(CpuIsaName(BestCpuIsa())).c_str(),
              static_cast<long long>(context));
  std::printf("%-10s %-22s %-11s %10s %10s %8s\n", "model", "case", "path",
              "ms", "GFLOP/s", "vs scalar");
  const Model models[] = {{"smollm2", 9, 3, 64}, {"llama3-8b", 32, 8, 128}};
  for (const Model& m : models) {
    const Cache cache = MakeCache(m, context);
    const PagedKvView view{cache.k, cache.v, 16, m.kv_heads, m.head_dim};
    const AttentionShape shape{m.heads, 0.125f};
    struct Case {
      const char* name;
      int64_t queries;
    } cases[] = {{"decode (1 query)", 1}, {"prefill (128 queries)", 128}};
    for (const Case& c : cases) {
      const int64_t start = context - c.queries;
      std::vector<float> q(
          static_cast<size_t>(c.queries * m.heads * m.head_dim));
      std::mt19937 rng(2);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (float& x : q) x = normal(rng);
      std::vector<float> out(q.size());
      double keys = 0;
      for (int64_t i = 0; i < c.queries; ++i)
        keys += static_cast<double>(start + i + 1);
      const double flops =
          4.0 * static_cast<double>(m.head_dim * m.heads) * keys;
      double scalar_s = 0;
      for (CpuIsa isa : isas) {
        const double s = bench::BestSeconds(reps, [&] {
          PagedAttention(q.data(), c.queries, start, shape, view, out.data(),
                         isa);
        });
        if (isa == CpuIsa::kScalar) scalar_s = s;
        std::printf("%-10s %-22s %-11s %10.3f %10.2f", m.name, c.name,
                    std::string(CpuIsaName(isa)).c_str(), s * 1e3,
                    flops / s / 1e9);
        if (scalar_s > 0) std::printf(" %7.2fx", scalar_s / s);
        std::printf("\n");
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  int reps = 5;
  int64_t context = 1024;
  std::vector<baton::CpuIsa> isas;
  for (baton::CpuIsa isa : baton::kAllCpuIsas) {
    if (baton::IsCpuIsaSupported(isa)) isas.push_back(isa);
  }
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--reps=", 7) == 0) {
      reps = std::atoi(argv[i] + 7);
    } else if (std::strncmp(argv[i], "--context=", 10) == 0) {
      context = std::atoll(argv[i] + 10);
    } else if (std::strncmp(argv[i], "--isas=", 7) == 0) {
      isas.clear();
      for (absl::string_view name : absl::StrSplit(argv[i] + 7, ',')) {
        absl::StatusOr<baton::CpuIsa> isa = baton::ParseCpuIsa(name);
        if (!isa.ok() || !baton::IsCpuIsaSupported(*isa)) {
          std::fprintf(stderr,
                       "attention_bench: --isas: '%s' is not a path "
                       "this CPU supports\n",
                       std::string(name).c_str());
          return 2;
        }
        isas.push_back(*isa);
      }
    } else {
      std::fprintf(stderr,
                   "usage: attention_bench [--reps=N] [--context=N] "
                   "[--isas=LIST]\n");
      return 2;
    }
  }
  if (reps < 1 || context < 128) {
    std::fprintf(stderr, "attention_bench: --reps >= 1, --context >= 128\n");
    return 2;
  }
  return baton::Run(reps, context, isas);
}
