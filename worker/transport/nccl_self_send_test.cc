// NCCL on one device with one rank: a communicator of nranks = 1 sends one
// 8192-token Llama-3-8B KV layer (8 KV heads x 128 dims x K,V x 2 bytes x
// 8192 tokens = 32 MiB) to itself with ncclSend/ncclRecv in one group, and
// the received bytes must equal the sent ones. Times the exchange and prints
//   BATON_KV_GBPS transport=nccl_self tokens=8192 gbps=<x>
// (bytes of one layer per exchange / best time of the timed exchanges).
// Skipped without a CUDA device.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"

namespace baton {
namespace {

using cuda_test::DeviceBuffer;

constexpr int64_t kTokens = 8192;
constexpr uint64_t kLayerBytes = uint64_t{8} * 128 * 2 * 2 * kTokens;

#define BATON_ASSERT_NCCL_OK(expr)                           \
  do {                                                       \
    const ncclResult_t baton_nccl_ = (expr);                 \
    ASSERT_EQ(baton_nccl_, ncclSuccess)                      \
        << #expr << ": " << ncclGetErrorString(baton_nccl_); \
  } while (false)

// Enqueues one grouped self send/recv of `bytes` on `stream`.
ncclResult_t SelfExchange(ncclComm_t comm, const void* send, void* recv,
                          uint64_t bytes, cudaStream_t stream) {
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  const ncclResult_t s = ncclSend(send, bytes, ncclUint8, 0, comm, stream);
  const ncclResult_t v = ncclRecv(recv, bytes, ncclUint8, 0, comm, stream);
  r = ncclGroupEnd();
  return s != ncclSuccess ? s : v != ncclSuccess ? v : r;
}

TEST(NcclSelfSendTest, OneRankSendsALlama3LayerToItself) {
  BATON_SKIP_WITHOUT_CUDA();
  BATON_ASSERT_CUDA_OK(cudaSetDevice(0));
  ncclUniqueId id;
  BATON_ASSERT_NCCL_OK(ncclGetUniqueId(&id));
  ncclComm_t comm = nullptr;
  BATON_ASSERT_NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  cudaStream_t stream = nullptr;
  BATON_ASSERT_CUDA_OK(
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  std::vector<uint8_t> host(kLayerBytes);
  std::mt19937_64 rng(8192);
  for (size_t i = 0; i < host.size(); i += 8) {
    const uint64_t x = rng();
    std::copy_n(reinterpret_cast<const uint8_t*>(&x), 8, &host[i]);
  }
  DeviceBuffer<uint8_t> send(host);
  DeviceBuffer<uint8_t> recv(kLayerBytes);
  recv.Poison();
  ASSERT_FALSE(::testing::Test::HasFatalFailure());

  BATON_ASSERT_NCCL_OK(
      SelfExchange(comm, send.get(), recv.get(), kLayerBytes, stream));
  BATON_ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
  const std::vector<uint8_t> got = recv.Download();
  size_t first_bad = got.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != host[i]) {
      first_bad = i;
      break;
    }
  }
  EXPECT_EQ(first_bad, got.size())
      << "received byte " << first_bad << " differs";

  cudaEvent_t start, stop;
  BATON_ASSERT_CUDA_OK(cudaEventCreate(&start));
  BATON_ASSERT_CUDA_OK(cudaEventCreate(&stop));
  float best_ms = 1e30f;
  for (int rep = 0; rep < 10; ++rep) {
    BATON_ASSERT_CUDA_OK(cudaEventRecord(start, stream));
    BATON_ASSERT_NCCL_OK(
        SelfExchange(comm, send.get(), recv.get(), kLayerBytes, stream));
    BATON_ASSERT_CUDA_OK(cudaEventRecord(stop, stream));
    BATON_ASSERT_CUDA_OK(cudaEventSynchronize(stop));
    float ms = 0;
    BATON_ASSERT_CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
    best_ms = std::min(best_ms, ms);
  }
  const double gbps = static_cast<double>(kLayerBytes) / (best_ms * 1e-3) / 1e9;
  std::printf("BATON_KV_GBPS transport=nccl_self tokens=%lld gbps=%.1f\n",
              static_cast<long long>(kTokens), gbps);
  std::printf("(one layer of %llu bytes per exchange, best of 10: %.3f ms)\n",
              static_cast<unsigned long long>(kLayerBytes), best_ms);
  EXPECT_GT(gbps, 0.0);

  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  BATON_ASSERT_NCCL_OK(ncclCommDestroy(comm));
}

}  // namespace
}  // namespace baton
