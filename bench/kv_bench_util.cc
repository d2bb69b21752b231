#include "bench/kv_bench_util.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace baton::kvbench {

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
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

void Die(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "kv_transfer_bench: %s: %s\n", what.c_str(),
               s.ToString().c_str());
  std::exit(1);
}

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

void TouchPool(KvCache& cache) {
  for (int64_t l = 0; l < cache.layout().num_layers; ++l) {
    for (int32_t b = 0; b < cache.num_blocks_total(); ++b) {
      std::memset(cache.LayerBlock(l, b), 0, cache.chunk_bytes());
    }
  }
}

}  // namespace baton::kvbench
