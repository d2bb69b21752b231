// SampleRows of sampling.h: the temperature / top-k / top-p / min-p draw.
// One block of kThreads threads per row; a token's position in the order is
// found by histogram descent over its key (Locate), never by sorting.
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/sampling_internal.h"

namespace baton::cuda {
namespace {

using sampling_internal::Add;
using sampling_internal::Best;
using sampling_internal::BlockBest;
using sampling_internal::BlockReduce;
using sampling_internal::CheckRows;
using sampling_internal::IsFinite;
using sampling_internal::kBins;
using sampling_internal::KeyOf;
using sampling_internal::kFullMask;
using sampling_internal::kMassScale;
using sampling_internal::kThreads;
using sampling_internal::kWarps;
using sampling_internal::Min;
using sampling_internal::Shared;

constexpr int kBinsPerLane = kBins / 32;
constexpr int kMaxLevels = 3;
// n_end value meaning "every token with the key k_end is kept".
constexpr uint32_t kAllTies = 0xFFFFFFFFu;

__device__ __forceinline__ float LogitOfKey(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) != 0u ? (key & 0x7FFFFFFFu)
                                                   : ~key);
}

// The CPU sampler's weight exp(-float((z_max - z) / temperature)), computed
// as it does: the difference and scaling in double, the exp in float.
__device__ __forceinline__ float WeightOf(float z, float z_max,
                                          double inv_temperature) {
  const float nats = static_cast<float>(
      (static_cast<double>(z_max) - static_cast<double>(z)) * inv_temperature);
  return expf(-nats);
}

__device__ __forceinline__ uint64_t MassOfWeight(float w) {
  return __float2ull_rn(w * kMassScale);
}

// Exclusive prefix sum of `flag` over the block in thread order; *total gets
// the block's sum (in every thread).
__device__ uint32_t BlockExclusiveScan(uint32_t flag, uint32_t* total,
                                       Shared& sh) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  uint32_t incl = flag;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const uint32_t o = __shfl_up_sync(kFullMask, incl, offset);
    if (lane >= offset) incl += o;
  }
  if (lane == 31) sh.scan[warp] = incl;
  __syncthreads();
  uint32_t warp_before = 0;
  uint32_t sum = 0;
  for (int w = 0; w < kWarps; ++w) {
    const uint32_t s = sh.scan[w];
    if (w < warp) warp_before += s;
    sum += s;
  }
  __syncthreads();
  *total = sum;
  return warp_before + incl - flag;
}

// The sampler's state for one row. Kept candidates: every token with
// key > k_end, plus the first n_end (in id order) of those with key ==
// k_end, or all of them if n_end == kAllTies.
struct Row {
  const float* z;
  int32_t vocab;
  float z_max;
  uint32_t key_max;
  uint32_t n_max;  // tokens with key_max
  double inv_temperature;
  uint32_t k_end;
  uint32_t n_end;
};

__device__ __forceinline__ uint64_t MassOfKey(const Row& r, uint32_t key) {
  return MassOfWeight(WeightOf(LogitOfKey(key), r.z_max, r.inv_temperature));
}

// Mass of the kept candidates.
__device__ uint64_t KeptMass(const Row& r, Shared& sh) {
  uint64_t local = 0;
  for (int32_t i = threadIdx.x; i < r.vocab; i += kThreads) {
    const float z = r.z[i];
    if (!IsFinite(z)) continue;
    const uint32_t key = KeyOf(z);
    if (key > r.k_end || (key == r.k_end && r.n_end == kAllTies)) {
      local += MassOfWeight(WeightOf(z, r.z_max, r.inv_temperature));
    }
  }
  uint64_t total = BlockReduce<uint64_t>(local, 0, Add(), sh.sum);
  if (r.n_end != kAllTies) total += r.n_end * MassOfKey(r, r.k_end);
  return total;
}

// A position in the order: the rank-th (0-based, id order) kept token with
// key `key`; `before` is the mass (or count) of kept tokens with larger keys.
struct Position {
  uint32_t key;
  uint32_t rank;
  uint64_t before;
  uint64_t unit;  // mass (or count, 1) of one token with `key`
};

// The first kept position whose cumulative count (by_mass false) or mass
// (by_mass true) is >= target. REQUIRES: 1 <= target <= the kept total.
__device__ Position Locate(const Row& r, bool by_mass, uint64_t target,
                           Shared& sh) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  uint32_t lo = r.k_end;
  uint32_t hi = r.key_max;
  uint64_t before = 0;
  // Kept tokens with key lo once lo == hi.
  uint32_t n_group = r.n_end != kAllTies ? r.n_end : r.n_max;
  for (int level = 0; level < kMaxLevels && lo < hi; ++level) {
    const uint64_t span = static_cast<uint64_t>(hi) - lo + 1;
    const uint32_t width = static_cast<uint32_t>((span + kBins - 1) / kBins);
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      sh.mass_hist[b] = 0;
      sh.count_hist[b] = 0;
    }
    __syncthreads();
    for (int32_t i = threadIdx.x; i < r.vocab; i += kThreads) {
      const float z = r.z[i];
      if (!IsFinite(z)) continue;
      const uint32_t key = KeyOf(z);
      if (key < lo || key > hi) continue;
      if (key == r.k_end && r.n_end != kAllTies) continue;  // Added below.
      const uint32_t bin = (key - lo) / width;
      atomicAdd(&sh.count_hist[bin], 1u);
      if (by_mass) {
        atomicAdd(reinterpret_cast<unsigned long long*>(&sh.mass_hist[bin]),
                  static_cast<unsigned long long>(
                      MassOfWeight(WeightOf(z, r.z_max, r.inv_temperature))));
      }
    }
    if (threadIdx.x == 0 && r.n_end != kAllTies && r.k_end >= lo &&
        r.k_end <= hi) {
      const uint32_t bin = (r.k_end - lo) / width;
      atomicAdd(&sh.count_hist[bin], r.n_end);
      if (by_mass) {
        atomicAdd(
            reinterpret_cast<unsigned long long*>(&sh.mass_hist[bin]),
            static_cast<unsigned long long>(r.n_end) * MassOfKey(r, r.k_end));
      }
    }
    __syncthreads();
    if (warp == 0) {
      // Lane l owns bins [l * 64, l * 64 + 64); the order walks bins from
      // the highest down.
      const int base = lane * kBinsPerLane;
      uint64_t lane_sum = 0;
      uint32_t lane_count = 0;
      for (int j = 0; j < kBinsPerLane; ++j) {
        lane_sum += by_mass ? sh.mass_hist[base + j] : sh.count_hist[base + j];
        lane_count += sh.count_hist[base + j];
      }
      // suffix = sum over lanes >= this one.
      uint64_t suffix = lane_sum;
      for (int offset = 1; offset < 32; offset <<= 1) {
        const uint64_t o = __shfl_down_sync(kFullMask, suffix, offset);
        if (lane + offset < 32) suffix += o;
      }
      const unsigned crossing =
          __ballot_sync(kFullMask, before + suffix >= target);
      const unsigned nonempty = __ballot_sync(kFullMask, lane_count > 0);
      // Crossing lanes form a prefix 0..l*; without one (only if target
      // exceeds the total) fall back to the last nonempty bin, the last
      // position.
      const int chosen = crossing != 0u   ? 31 - __clz(crossing)
                         : nonempty != 0u ? __ffs(nonempty) - 1
                                          : 0;
      if (lane == chosen) {
        uint64_t running = before + suffix - lane_sum;
        uint32_t bin = base;
        uint64_t bin_before = running;
        for (int j = kBinsPerLane - 1; j >= 0; --j) {
          const int b = base + j;
          const uint64_t v = by_mass ? sh.mass_hist[b] : sh.count_hist[b];
          if (crossing != 0u) {
            if (running + v >= target) {
              bin = b;
              bin_before = running;
              break;
            }
          } else if (sh.count_hist[b] > 0) {
            bin = b;
            bin_before = running;
          }
          running += v;
        }
        sh.found_bin = bin;
        sh.found_before = bin_before;
        sh.found_target = crossing != 0u
                              ? target
                              : bin_before + (by_mass ? sh.mass_hist[bin]
                                                      : sh.count_hist[bin]);
      }
    }
    __syncthreads();
    const uint32_t bin = sh.found_bin;
    before = sh.found_before;
    target = sh.found_target;
    n_group = sh.count_hist[bin];
    lo = lo + bin * width;
    const uint64_t bin_last = static_cast<uint64_t>(lo) + width - 1;
    if (bin_last < hi) hi = static_cast<uint32_t>(bin_last);
    __syncthreads();
  }
  Position p;
  p.key = lo;
  p.before = before;
  p.unit = by_mass ? MassOfKey(r, lo) : 1u;
  uint32_t rank = 0;
  if (target > before && p.unit > 0) {
    const uint64_t q = (target - before - 1) / p.unit;
    rank = q < n_group ? static_cast<uint32_t>(q) : n_group;
  } else if (p.unit == 0) {
    rank = n_group;  // Clamped below to the last one.
  }
  p.rank = n_group > 0 && rank >= n_group ? n_group - 1 : rank;
  return p;
}

// Id of the rank-th (0-based) token, in id order, whose key is `key`.
// fallback if there are fewer.
__device__ int32_t TokenWithKey(const Row& r, uint32_t key, uint32_t rank,
                                int32_t fallback, Shared& sh) {
  __shared__ int32_t found;
  if (threadIdx.x == 0) found = fallback;
  uint32_t seen = 0;  // Same in every thread.
  for (int32_t base = 0; base < r.vocab; base += kThreads) {
    const int32_t i = base + static_cast<int32_t>(threadIdx.x);
    const uint32_t flag =
        i < r.vocab && IsFinite(r.z[i]) && KeyOf(r.z[i]) == key ? 1u : 0u;
    uint32_t chunk = 0;
    const uint32_t excl = BlockExclusiveScan(flag, &chunk, sh);
    if (flag != 0u && seen + excl == rank) found = i;
    seen += chunk;
    if (seen > rank) break;
  }
  __syncthreads();
  return found;
}

__global__ void __launch_bounds__(kThreads)
    SampleKernel(const float* logits, const SampleRowParams* params,
                 int32_t* tokens, int32_t vocab) {
  __shared__ Shared sh;
  const SampleRowParams p = params[blockIdx.x];
  Row r;
  r.z = logits + static_cast<size_t>(blockIdx.x) * vocab;
  r.vocab = vocab;
  const Best best = BlockBest(r.z, vocab, /*finite_only=*/true, sh);
  if (best.n_cand == 0) {
    if (threadIdx.x == 0) tokens[blockIdx.x] = -1;
    return;
  }
  if (!(p.temperature > 0.0) || best.n_cand == 1) {
    if (threadIdx.x == 0) tokens[blockIdx.x] = best.id;
    return;
  }
  r.z_max = best.z;
  r.key_max = KeyOf(best.z);
  r.n_max = best.n_at;
  r.inv_temperature = 1.0 / fmax(p.temperature, 1e-300);
  r.k_end = best.key_min;
  r.n_end = kAllTies;

  if (p.top_k > 0 && static_cast<uint32_t>(p.top_k) < best.n_cand) {
    const Position k =
        Locate(r, /*by_mass=*/false, static_cast<uint64_t>(p.top_k), sh);
    r.k_end = k.key;
    r.n_end = k.rank + 1;
  }
  uint64_t total = KeptMass(r, sh);

  if (p.top_p < 1.0) {
    const double y = ceil(p.top_p * static_cast<double>(total));
    uint64_t target = y >= static_cast<double>(total) ? total
                      : y >= 1.0                      ? static_cast<uint64_t>(y)
                                                      : 1u;
    if (target > total) target = total;
    const Position c = Locate(r, /*by_mass=*/true, target, sh);
    r.k_end = c.key;
    r.n_end = c.rank + 1;
    total = c.before + (c.rank + 1) * c.unit;
  }

  if (p.min_p > 0.0) {
    const bool end_passes =
        static_cast<double>(WeightOf(LogitOfKey(r.k_end), r.z_max,
                                     r.inv_temperature)) >= p.min_p;
    if (!end_passes) {
      uint32_t local = 0xFFFFFFFFu;
      for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
        const float z = r.z[i];
        if (!IsFinite(z)) continue;
        const uint32_t key = KeyOf(z);
        if (key <= r.k_end || key >= local) continue;
        if (key == r.key_max ||
            static_cast<double>(WeightOf(z, r.z_max, r.inv_temperature)) >=
                p.min_p) {
          local = key;
        }
      }
      // None above k_end passes only if min_p > 1 (invalid): no change.
      const uint32_t k_min_p =
          BlockReduce<uint32_t>(local, 0xFFFFFFFFu, Min(), sh.scan);
      if (k_min_p != 0xFFFFFFFFu) {
        r.k_end = k_min_p;
        r.n_end = kAllTies;
        total = KeptMass(r, sh);
      }
    }
  }

  // Draw: the first position whose cumulative mass exceeds u * total.
  double u = p.uniform;
  if (!(u >= 0.0)) u = 0.0;
  const double x = floor(u * static_cast<double>(total));
  uint64_t below =
      x < static_cast<double>(total) ? static_cast<uint64_t>(x) : total - 1;
  if (below >= total) below = total - 1;
  const Position d = Locate(r, /*by_mass=*/true, below + 1, sh);
  const int32_t token = TokenWithKey(r, d.key, d.rank, best.id, sh);
  if (threadIdx.x == 0) tokens[blockIdx.x] = token;
}

}  // namespace

cudaError_t SampleRows(const float* logits, const SampleRowParams* params,
                       int32_t* tokens, int32_t batch, int32_t vocab,
                       cudaStream_t stream) {
  BATON_CUDA_RETURN_IF_ERROR(CheckRows(logits, params, tokens, batch, vocab));
  if (batch == 0) return cudaSuccess;
  SampleKernel<<<batch, kThreads, 0, stream>>>(logits, params, tokens, vocab);
  BATON_CUDA_RETURN_LAUNCH_ERROR();
}

}  // namespace baton::cuda
