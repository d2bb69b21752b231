// libFuzzer target: arbitrary bytes through every KV wire decoder, as a peer
// (or anyone who reaches a KV port) could send them:
//   - a TCP frame header (kv_wire.h) and a layer trailer,
//   - a CUDA IPC grant, and a stream of CUDA IPC verdicts read from a socket
//     (header, message, grant length, grant),
//   - an NCCL control message (padded to kNcclControlBytes).
// Each decoder accepts or returns a status with a message (never a crash or
// sanitizer report), and what it accepts encodes back to bytes that decode
// to the same value.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "absl/time/time.h"
#include "common/check.h"
#include "worker/transport/cuda_ipc_wire.h"
#include "worker/transport/kv_wire.h"
#include "worker/transport/nccl_kv_wire.h"
#include "worker/transport/socket_io.h"

namespace {

void FrameHeader(std::span<const uint8_t> in) {
  baton::KvFrameBytes bytes{};
  std::copy_n(in.begin(), std::min(in.size(), bytes.size()), bytes.begin());
  auto frame = baton::DecodeKvFrame(bytes);
  if (!frame.ok()) {
    BATON_CHECK(!frame.status().message().empty());
    return;
  }
  const baton::KvFrameBytes again = baton::EncodeKvFrame(*frame);
  auto reread = baton::DecodeKvFrame(again);
  BATON_CHECK(reread.ok()) << reread.status();
  BATON_CHECK(baton::EncodeKvFrame(*reread) == again);

  std::array<uint8_t, baton::kKvTrailerBytes> trailer{};
  std::copy_n(in.begin(), std::min(in.size(), trailer.size()), trailer.begin());
  BATON_CHECK(baton::EncodeKvTrailer(baton::DecodeKvTrailer(trailer)) ==
              trailer);
}

void Grant(std::span<const uint8_t> in) {
  auto grant = baton::DecodeCudaIpcGrant(in);
  if (!grant.ok()) {
    BATON_CHECK(!grant.status().message().empty());
    return;
  }
  const std::vector<uint8_t> again = baton::EncodeCudaIpcGrant(*grant);
  auto reread = baton::DecodeCudaIpcGrant(again);
  BATON_CHECK(reread.ok()) << reread.status();
  BATON_CHECK(baton::EncodeCudaIpcGrant(*reread) == again);
}

// Verdicts as a sender reads them from its connection, until the bytes run
// out (a clean error at the end of the stream).
void Verdicts(std::span<const uint8_t> in) {
  int fds[2];
  BATON_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  baton::UniqueFd reader(fds[0]);
  {
    baton::UniqueFd writer(fds[1]);
    size_t sent = 0;
    while (sent < in.size()) {
      const ssize_t n = write(writer.get(), in.data() + sent, in.size() - sent);
      BATON_CHECK(n > 0) << "the fuzz input does not fit a socket buffer";
      sent += static_cast<size_t>(n);
    }
  }
  baton::SocketIoOptions io;
  io.stall_timeout = absl::Seconds(1);  // every byte is there already
  for (int i = 0; i < 64; ++i) {
    auto verdict = baton::ReadCudaIpcVerdict(reader.get(), io);
    if (!verdict.ok()) {
      BATON_CHECK(!verdict.status().message().empty());
      return;
    }
    BATON_CHECK(!verdict->grant.has_value() || verdict->status.ok());
  }
}

void NcclControl(std::span<const uint8_t> in) {
  std::vector<uint8_t> padded(baton::kNcclControlBytes, 0);
  std::copy_n(in.begin(), std::min<size_t>(in.size(), padded.size()),
              padded.begin());
  auto control = baton::DecodeNcclControl(
      std::span<const uint8_t, baton::kNcclControlBytes>(padded.data(),
                                                         padded.size()));
  if (!control.ok()) {
    BATON_CHECK(!control.status().message().empty());
    return;
  }
  std::vector<uint8_t> again(baton::kNcclControlBytes, 0);
  baton::EncodeNcclControl(
      *control,
      std::span<uint8_t, baton::kNcclControlBytes>(again.data(), again.size()));
  auto reread = baton::DecodeNcclControl(
      std::span<const uint8_t, baton::kNcclControlBytes>(again.data(),
                                                         again.size()));
  BATON_CHECK(reread.ok()) << reread.status();
  std::vector<uint8_t> third(baton::kNcclControlBytes, 0);
  baton::EncodeNcclControl(
      *reread,
      std::span<uint8_t, baton::kNcclControlBytes>(third.data(), third.size()));
  BATON_CHECK(third == again);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> in(data, size);
  FrameHeader(in);
  Grant(in);
  if (size <= 65536) Verdicts(in);
  NcclControl(in);
  return 0;
}
