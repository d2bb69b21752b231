// The receiving process of the cross-process CUDA IPC check
// (cuda_ipc_kv_gpu_test.cc starts it; it also runs by hand):
//
//   cuda_ipc_kv_probe [timeout_seconds]
//
// Reserves the fixture's 8192-token Llama-3-8B sequence (after a 3-block
// spacer) in a KV pool on device 0 whose every byte starts as 0xFF, serves a
// CudaIpcKvReceiver, prints "PORT <port>" on stdout, accepts
// cuda_ipc_fixture::kTransfers transfers (ids 1, 2, ...) into that
// reservation, then checks every chunk of the device pool: the reserved
// blocks hold FillChunk's bytes, every other block still 0xFF. Prints
// "BATON_CUDA_IPC_PROBE ok=<0|1> ..." and exits 0 only if all is well.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "worker/kv_cache/kv_cache.h"
#include "worker/transport/cuda_ipc_kv_transport.h"
#include "worker/transport/cuda_ipc_llama_fixture.h"

namespace baton {
namespace {

namespace fx = cuda_ipc_fixture;

int Fail(const std::string& why) {
  std::printf("BATON_CUDA_IPC_PROBE ok=0 error=\"%s\"\n", why.c_str());
  std::fflush(stdout);
  return 1;
}

int Run(int timeout_s) {
  const KvLayout layout = fx::Llama3Layout();
  KvCacheOptions o;
  o.num_layers = layout.num_layers;
  o.num_kv_heads = layout.num_kv_heads;
  o.head_dim = layout.head_dim;
  o.block_size = layout.block_size;
  const int64_t blocks = fx::kTokens / layout.block_size;
  o.num_blocks = blocks + 5;
  absl::StatusOr<std::unique_ptr<KvCache>> cache = KvCache::Create(o);
  if (!cache.ok()) return Fail(std::string(cache.status().message()));
  BlockTable spacer, table;
  if (!(*cache)->Reserve(spacer, 3 * layout.block_size).ok() ||
      !(*cache)->Reserve(table, fx::kTokens).ok()) {
    return Fail("reserve");
  }
  const uint64_t pool_bytes = (*cache)->pool_bytes();
  void* pool = nullptr;
  if (cudaSetDevice(0) != cudaSuccess ||
      cudaMalloc(&pool, pool_bytes) != cudaSuccess ||
      cudaMemset(pool, 0xFF, pool_bytes) != cudaSuccess ||
      cudaDeviceSynchronize() != cudaSuccess) {
    return Fail(absl::StrCat("device pool of ", pool_bytes, " bytes: ",
                             cudaGetErrorString(cudaGetLastError())));
  }
  std::unique_ptr<CudaIpcApi> api = CreateCudaIpcApi();
  absl::Mutex mu;
  int num_ok = 0;
  std::string error;
  CudaIpcKvReceiverCallbacks cb;
  cb.lookup = [&](uint64_t id) -> absl::StatusOr<CudaIpcKvTarget> {
    if (id < 1 || id > static_cast<uint64_t>(fx::kTransfers)) {
      return absl::NotFoundError(absl::StrCat("no reservation for ", id));
    }
    CudaIpcKvTarget t;
    t.target.cache = cache->get();
    t.target.table = &table;
    t.target.expected_layout = layout;
    t.target.num_tokens = fx::kTokens;
    t.device_pool = pool;
    return t;
  };
  cb.on_done = [&](uint64_t id, absl::Status s) {
    absl::MutexLock lock(&mu);
    if (s.ok()) {
      ++num_ok;
    } else if (error.empty()) {
      error = absl::StrCat("transfer ", id, ": ", s.ToString());
    }
  };
  CudaIpcKvReceiverOptions options;
  auto receiver = CudaIpcKvReceiver::Start(api.get(), options, cb);
  if (!receiver.ok()) return Fail(std::string(receiver.status().message()));
  std::printf("PORT %d\n", (*receiver)->port());
  std::fflush(stdout);
  {
    absl::MutexLock lock(&mu);
    auto finished = [&] { return num_ok == fx::kTransfers || !error.empty(); };
    mu.AwaitWithTimeout(absl::Condition(&finished), absl::Seconds(timeout_s));
    if (!error.empty()) return Fail(error);
    if (num_ok != fx::kTransfers)
      return Fail("timed out waiting for transfers");
  }
  receiver->reset();

  // Every chunk of every layer: reserved ones hold the pattern, others 0xFF.
  const uint64_t chunk = (*cache)->chunk_bytes();
  const int64_t nb = (*cache)->num_blocks_total();
  std::vector<int64_t> index_of(nb, -1);
  for (int64_t i = 0; i < blocks; ++i) index_of[table.block_ids()[i]] = i;
  std::vector<uint8_t> host(nb * chunk), want(chunk);
  int64_t bad_chunks = 0;
  for (int64_t l = 0; l < layout.num_layers; ++l) {
    if (cudaMemcpy(host.data(), static_cast<uint8_t*>(pool) + l * nb * chunk,
                   host.size(), cudaMemcpyDeviceToHost) != cudaSuccess) {
      return Fail("download");
    }
    for (int64_t b = 0; b < nb; ++b) {
      if (index_of[b] >= 0) {
        fx::FillChunk(l, index_of[b], want);
      } else {
        std::fill(want.begin(), want.end(), 0xFF);
      }
      bad_chunks += std::memcmp(&host[b * chunk], want.data(), chunk) != 0;
    }
  }
  cudaFree(pool);
  (*cache)->Free(table);
  (*cache)->Free(spacer);
  if (bad_chunks != 0) {
    return Fail(absl::StrCat(bad_chunks, " chunks differ"));
  }
  std::printf(
      "BATON_CUDA_IPC_PROBE ok=1 transfers=%d layers=%lld bytes=%llu\n",
      fx::kTransfers, static_cast<long long>(layout.num_layers),
      static_cast<unsigned long long>(blocks * chunk * layout.num_layers));
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  const int timeout_s = argc > 1 ? std::atoi(argv[1]) : 120;
  return baton::Run(timeout_s > 0 ? timeout_s : 120);
}
