#include "worker/transport/cuda_ipc_llama_fixture.h"

#include <algorithm>
#include <cstring>

#include "common/check.h"

namespace baton::cuda_ipc_fixture {

KvLayout Llama3Layout() { return {32, 8, 128, 16, DType::kF16}; }

void FillChunk(int64_t layer, int64_t index, std::span<uint8_t> out) {
  BATON_CHECK_EQ(out.size() % 8, 0u);
  uint64_t state = (static_cast<uint64_t>(layer) << 32) ^
                   static_cast<uint64_t>(index) ^ 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < out.size(); i += 8) {
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(&out[i], &z, 8);
  }
}

std::vector<int32_t> FragmentedBlockIds(int64_t blocks) {
  std::vector<int32_t> ids(static_cast<size_t>(blocks));
  for (int64_t i = 0; i < blocks; ++i) ids[i] = static_cast<int32_t>(i);
  for (int64_t g = 0; g < blocks; g += 16) {
    std::reverse(ids.begin() + g, ids.begin() + std::min(blocks, g + 16));
  }
  return ids;
}

}  // namespace baton::cuda_ipc_fixture
