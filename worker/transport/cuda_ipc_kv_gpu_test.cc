// The CUDA IPC KV transport on a real device. Skipped without one.
//
// CrossProcessTransferOfLlama3Cache: this process is the prefill side; it
// starts cuda_ipc_kv_probe (the decode side, a separate process, as CUDA IPC
// requires) and sends it an 8192-token Llama-3-8B-shaped cache twice from a
// fragmented device pool; the probe checks every byte of its pool. The
// second transfer is timed (control round trips included) and printed as
//   BATON_KV_GBPS transport=cuda_ipc tokens=8192 gbps=<x>
// DeviceCopyPath: the same copies within this process (no IPC, no control),
// printed as BATON_KV_COPY_GBPS lines for the fragmented and contiguous
// cases.
#include <cuda_runtime.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "worker/transport/cuda_ipc_kv_transport.h"
#include "worker/transport/cuda_ipc_llama_fixture.h"

extern char** environ;

namespace baton {
namespace {

namespace fx = cuda_ipc_fixture;

constexpr int64_t kBlocks = fx::kTokens / 16;

// A device pool of kBlocks blocks per layer whose chunk (l, ids[i]) holds
// FillChunk(l, i).
class SourcePool {
 public:
  SourcePool() : ids_(fx::FragmentedBlockIds(kBlocks)) {
    const KvLayout layout = fx::Llama3Layout();
    chunk_ = layout.chunk_bytes();
    bytes_ = static_cast<uint64_t>(layout.num_layers) * kBlocks * chunk_;
    EXPECT_EQ(cudaMalloc(&pool_, bytes_), cudaSuccess);
    std::vector<uint8_t> host(kBlocks * chunk_);
    for (int64_t l = 0; l < layout.num_layers; ++l) {
      for (int64_t i = 0; i < kBlocks; ++i) {
        fx::FillChunk(l, i,
                      std::span<uint8_t>(&host[ids_[i] * chunk_], chunk_));
      }
      EXPECT_EQ(cudaMemcpy(static_cast<uint8_t*>(pool_) + l * host.size(),
                           host.data(), host.size(), cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  }
  ~SourcePool() { cudaFree(pool_); }
  KvDeviceLayerSource Source() const { return {pool_, kBlocks, ids_}; }
  uint8_t* pool() const { return static_cast<uint8_t*>(pool_); }
  uint64_t bytes() const { return bytes_; }
  uint64_t chunk() const { return chunk_; }
  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  std::vector<int32_t> ids_;
  uint64_t chunk_ = 0;
  uint64_t bytes_ = 0;
  void* pool_ = nullptr;
};

KvTransferHeader Header(uint64_t id, int64_t layer) {
  KvTransferHeader h;
  h.transfer_id = id;
  h.request_id = absl::StrCat("req-", id);
  h.layout = fx::Llama3Layout();
  h.num_tokens = fx::kTokens;
  h.layer = layer;
  h.payload_bytes = kBlocks * h.layout.chunk_bytes();
  return h;
}

// Reads one '\n'-terminated line from fd within `timeout`.
std::string ReadLine(int fd, absl::Duration timeout) {
  std::string line;
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char c;
    if (read(fd, &c, 1) != 1) break;
    if (c == '\n') return line;
    line.push_back(c);
  }
  return line;
}

// Kills and reaps the child on an early return (a failed ASSERT).
struct ChildGuard {
  pid_t pid = -1;
  ~ChildGuard() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

TEST(CudaIpcGpuTest, CrossProcessTransferOfLlama3Cache) {
  BATON_SKIP_WITHOUT_CUDA();
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  // $BATON_CUDA_IPC_PROBE (scripts/gpu_check.sh's bundle) or the build's.
  const char* probe_env = std::getenv("BATON_CUDA_IPC_PROBE");
  const std::string probe =
      probe_env != nullptr ? probe_env : BATON_CUDA_IPC_PROBE;
  char* argv[] = {const_cast<char*>(probe.c_str()), const_cast<char*>("120"),
                  nullptr};
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, probe.c_str(), &actions, nullptr, argv, environ),
            0)
      << probe;
  ChildGuard child{pid};
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  const std::string first = ReadLine(out[0], absl::Seconds(60));
  int port = 0;
  ASSERT_EQ(std::sscanf(first.c_str(), "PORT %d", &port), 1)
      << "probe said '" << first << "' instead of its port";

  SourcePool source;
  std::unique_ptr<CudaIpcApi> api = CreateCudaIpcApi();
  auto mappings = CudaIpcPeerMappings::Create(api.get(), 0);
  ASSERT_TRUE(mappings.ok());
  const std::string endpoint = absl::StrCat("127.0.0.1:", port);
  double seconds = 0;
  for (uint64_t id = 1; id <= fx::kTransfers; ++id) {
    auto sender = CudaIpcKvSender::Connect(mappings->get(), endpoint, id);
    ASSERT_TRUE(sender.ok()) << sender.status();
    const absl::Time start = absl::Now();
    for (int64_t l = 0; l < fx::Llama3Layout().num_layers; ++l) {
      const absl::Status s =
          (*sender)->SendLayerFromPool(Header(id, l), source.Source());
      ASSERT_TRUE(s.ok()) << "layer " << l << ": " << s;
    }
    const absl::Status finished = (*sender)->Finish();
    ASSERT_TRUE(finished.ok()) << finished;
    seconds = absl::ToDoubleSeconds(absl::Now() - start);
  }
  EXPECT_EQ((*mappings)->num_cached(), 1);
  mappings->reset();  // closes the mapping so the probe can free its pool
  std::string rest;
  for (std::string line = ReadLine(out[0], absl::Seconds(60)); !line.empty();
       line = ReadLine(out[0], absl::Seconds(10))) {
    rest += line + "\n";
  }
  close(out[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  child.pid = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << rest;
  EXPECT_THAT(rest, ::testing::HasSubstr("BATON_CUDA_IPC_PROBE ok=1"));
  const double gbps = static_cast<double>(source.bytes()) / seconds / 1e9;
  std::printf("BATON_KV_GBPS transport=cuda_ipc tokens=%lld gbps=%.1f\n",
              static_cast<long long>(fx::kTokens), gbps);
  std::printf(
      "(cross-process, 32 layers, %llu bytes, %.3f ms, layer by "
      "layer with control round trips)\n",
      static_cast<unsigned long long>(source.bytes()), seconds * 1e3);
}

TEST(CudaIpcGpuTest, DeviceCopyPath) {
  BATON_SKIP_WITHOUT_CUDA();
  SourcePool source;
  void* dst = nullptr;
  ASSERT_EQ(cudaMalloc(&dst, source.bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemset(dst, 0, source.bytes()), cudaSuccess);
  std::unique_ptr<CudaIpcApi> api = CreateCudaIpcApi();
  auto stream = api->StreamCreate(0);
  ASSERT_TRUE(stream.ok()) << stream.status();
  const int64_t layers = fx::Llama3Layout().num_layers;
  const uint64_t chunk = source.chunk();
  // Destination i = block i (contiguous); sources fragmented or contiguous.
  for (const bool fragmented : {true, false}) {
    std::vector<std::vector<CudaIpcApi::Copy>> plans(layers);
    for (int64_t l = 0; l < layers; ++l) {
      std::vector<CudaIpcSourceRange> ranges(kBlocks);
      std::vector<uint8_t*> dsts(kBlocks);
      for (int64_t i = 0; i < kBlocks; ++i) {
        const int64_t b = fragmented ? source.ids()[i] : i;
        ranges[i] = {source.pool() + (l * kBlocks + b) * chunk, chunk};
        dsts[i] = static_cast<uint8_t*>(dst) + (l * kBlocks + i) * chunk;
      }
      plans[l] = PlanCudaIpcCopies(ranges, dsts, chunk);
    }
    double best = 1e30;
    for (int rep = 0; rep < 4; ++rep) {
      const absl::Time start = absl::Now();
      for (int64_t l = 0; l < layers; ++l) {
        ASSERT_TRUE(api->CopyBatchAsync(0, plans[l], *stream).ok());
      }
      ASSERT_TRUE(WaitCudaIpcStream(*api, *stream,
                                    absl::Now() + absl::Seconds(30),
                                    absl::Microseconds(5), "copy")
                      .ok());
      best = std::min(best, absl::ToDoubleSeconds(absl::Now() - start));
    }
    if (fragmented) {
      // Destination chunk (l, i) must hold FillChunk(l, i).
      std::vector<uint8_t> got(chunk), want(chunk);
      for (int64_t l : {int64_t{0}, layers - 1}) {
        for (int64_t i : {int64_t{0}, int64_t{1}, kBlocks - 1}) {
          ASSERT_EQ(
              cudaMemcpy(got.data(),
                         static_cast<uint8_t*>(dst) + (l * kBlocks + i) * chunk,
                         chunk, cudaMemcpyDeviceToHost),
              cudaSuccess);
          fx::FillChunk(l, i, want);
          EXPECT_EQ(got, want) << "layer " << l << " chunk " << i;
        }
      }
    }
    std::printf(
        "BATON_KV_COPY_GBPS path=%s tokens=%lld copies_per_layer=%zu "
        "gbps=%.1f\n",
        fragmented ? "fragmented" : "contiguous",
        static_cast<long long>(fx::kTokens), plans[0].size(),
        static_cast<double>(source.bytes()) / best / 1e9);
  }
  api->StreamDestroy(0, *stream);
  cudaFree(dst);
}

TEST(CudaIpcGpuTest, ExportNamesTheOffsetInsideTheAllocation) {
  BATON_SKIP_WITHOUT_CUDA();
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 1 << 20), cudaSuccess);
  std::unique_ptr<CudaIpcApi> api = CreateCudaIpcApi();
  auto ex = api->ExportMemory(0, static_cast<uint8_t*>(p) + 4096);
  ASSERT_TRUE(ex.ok()) << ex.status();
  EXPECT_EQ(ex->offset, 4096u);
  EXPECT_GE(ex->allocation_bytes, uint64_t{1} << 20);
  cudaFree(p);
}

}  // namespace
}  // namespace baton
