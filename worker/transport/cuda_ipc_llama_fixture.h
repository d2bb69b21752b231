// What the cross-process CUDA IPC check's two processes agree on: an
// 8192-token Llama-3-8B-shaped KV cache (32 layers, 8 KV heads, head_dim 128,
// 16-token blocks, F16: 64 KiB chunks, 32 MiB per layer, 1 GiB in all), the
// bytes of every chunk, and the sender's (fragmented) block ids.
#ifndef BATON_WORKER_TRANSPORT_CUDA_IPC_LLAMA_FIXTURE_H_
#define BATON_WORKER_TRANSPORT_CUDA_IPC_LLAMA_FIXTURE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "worker/kv_cache/kv_layout.h"

namespace baton::cuda_ipc_fixture {

inline constexpr int64_t kTokens = 8192;
// Transfers the probe receives; the sender times the last one (the first
// pays for cudaIpcOpenMemHandle).
inline constexpr int kTransfers = 2;

KvLayout Llama3Layout();

// The content of chunk `index` (token order) of `layer`: a splitmix64
// stream seeded by (layer, index). out.size() must be a multiple of 8.
void FillChunk(int64_t layer, int64_t index, std::span<uint8_t> out);

// A permutation of [0, blocks): each run of 16 ids reversed, so no two
// consecutive chunks of the sequence are adjacent in the pool (one copy per
// chunk, the worst case for the copy plan).
std::vector<int32_t> FragmentedBlockIds(int64_t blocks);

}  // namespace baton::cuda_ipc_fixture

#endif  // BATON_WORKER_TRANSPORT_CUDA_IPC_LLAMA_FIXTURE_H_
