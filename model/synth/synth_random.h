// Counter-based random weights: element i of a stream depends only on the
// stream key and i, so any slice of a tensor can be generated independently
// (by any thread, in any order) and the result is the same on every machine.
#ifndef BATON_MODEL_SYNTH_SYNTH_RANDOM_H_
#define BATON_MODEL_SYNTH_SYNTH_RANDOM_H_

#include <cstdint>
#include <span>

#include "absl/strings/string_view.h"

namespace baton {

// A bijective 64-bit mixer (the splitmix64 finaliser).
inline uint64_t SynthMix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// The stream key of tensor `name` in a model generated with `seed`: a tensor
// has the same values whatever else the model contains.
inline uint64_t SynthStreamKey(uint64_t seed, absl::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (char c : name) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return SynthMix64(seed ^ SynthMix64(h));
}

// out[j] = element (first + j) of stream `key`: uniform on
// (-half_width, half_width), symmetric, with 2^24 equally spaced levels.
inline void SynthFillUniform(uint64_t key, uint64_t first, float half_width,
                             std::span<float> out) {
  const float scale = half_width / 8388608.0f;  // 2^23
  uint64_t counter = key + first * 0x9e3779b97f4a7c15ull;
  for (float& v : out) {
    counter += 0x9e3779b97f4a7c15ull;
    int32_t level = static_cast<int32_t>(SynthMix64(counter) >> 40);  // 24 bits
    v = (static_cast<float>(level - 8388608) + 0.5f) * scale;
  }
}

}  // namespace baton

#endif  // BATON_MODEL_SYNTH_SYNTH_RANDOM_H_
