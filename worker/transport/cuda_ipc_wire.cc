#include "worker/transport/cuda_ipc_wire.h"

#include <sys/uio.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace baton {
namespace {

void Put64(uint8_t* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}
void Put32(uint8_t* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t Get64(const uint8_t* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(in[i]) << (8 * i);
  return v;
}
uint32_t Get32(const uint8_t* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(in[i]) << (8 * i);
  return v;
}

// Frame header plus up to two body pieces.
absl::Status SendFrame(int fd, const KvFrame& frame, absl::string_view body1,
                       std::span<const uint8_t> body2,
                       const SocketIoOptions& io, absl::string_view what) {
  KvFrameBytes bytes = EncodeKvFrame(frame);
  iovec iov[3] = {{bytes.data(), bytes.size()},
                  {const_cast<char*>(body1.data()), body1.size()},
                  {const_cast<uint8_t*>(body2.data()), body2.size()}};
  return SendAllV(fd, iov, 3, io, what);
}

KvFrame StatusFrame(KvFrameKind kind, uint64_t transfer_id,
                    const absl::Status& status, absl::string_view message) {
  KvFrame f;
  f.kind = kind;
  f.header.transfer_id = transfer_id;
  f.status_code = static_cast<uint32_t>(status.code());
  f.header.payload_bytes = message.size();
  return f;
}

}  // namespace

std::vector<uint8_t> EncodeCudaIpcGrant(const CudaIpcGrant& grant) {
  BATON_CHECK_LE(grant.block_ids.size(), kCudaIpcMaxGrantBlocks);
  std::vector<uint8_t> out(kCudaIpcGrantHeaderBytes +
                           4 * grant.block_ids.size());
  Put32(&out[0], kCudaIpcGrantMagic);
  Put32(&out[4], static_cast<uint32_t>(grant.block_ids.size()));
  std::copy(grant.handle.begin(), grant.handle.end(), &out[8]);
  Put64(&out[72], grant.pool_offset);
  Put64(&out[80], grant.pool_bytes);
  Put64(&out[88], static_cast<uint64_t>(grant.num_blocks_total));
  for (size_t i = 0; i < grant.block_ids.size(); ++i) {
    Put32(&out[kCudaIpcGrantHeaderBytes + 4 * i],
          static_cast<uint32_t>(grant.block_ids[i]));
  }
  return out;
}

absl::StatusOr<CudaIpcGrant> DecodeCudaIpcGrant(std::span<const uint8_t> in) {
  if (in.size() < kCudaIpcGrantHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA IPC grant of ", in.size(), " bytes, at least ",
                     kCudaIpcGrantHeaderBytes, " expected"));
  }
  const uint8_t* b = in.data();
  if (const uint32_t magic = Get32(b); magic != kCudaIpcGrantMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA IPC grant: magic 0x", absl::Hex(magic),
                     " vs expected 0x", absl::Hex(kCudaIpcGrantMagic)));
  }
  const uint32_t n = Get32(b + 4);
  if (n > kCudaIpcMaxGrantBlocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA IPC grant: ", n, " block ids, at most ", kCudaIpcMaxGrantBlocks));
  }
  if (in.size() != kCudaIpcGrantHeaderBytes + uint64_t{4} * n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA IPC grant: ", in.size(), " bytes for ", n, " block ids, ",
        kCudaIpcGrantHeaderBytes + uint64_t{4} * n, " expected"));
  }
  CudaIpcGrant g;
  std::copy_n(b + 8, kCudaIpcHandleBytes, g.handle.begin());
  g.pool_offset = Get64(b + 72);
  g.pool_bytes = Get64(b + 80);
  g.num_blocks_total = static_cast<int64_t>(Get64(b + 88));
  if (g.num_blocks_total <= 0 || g.pool_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA IPC grant: num_blocks_total ", g.num_blocks_total,
                     " and pool_bytes ", g.pool_bytes, " must both be > 0"));
  }
  g.block_ids.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    const int32_t id =
        static_cast<int32_t>(Get32(b + kCudaIpcGrantHeaderBytes + 4 * i));
    if (id < 0 || id >= g.num_blocks_total) {
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA IPC grant: block id ", id, " at index ", i,
                       " not in [0, ", g.num_blocks_total, ")"));
    }
    g.block_ids[i] = id;
  }
  return g;
}

absl::Status SendCudaIpcLayer(int fd, const KvTransferHeader& header,
                              const SocketIoOptions& io) {
  KvFrame f;
  f.kind = KvFrameKind::kLayer;
  f.header = header;
  const std::string ids = header.request_id + header.model_id;
  return SendFrame(fd, f, ids, {}, io,
                   absl::StrCat("sending KV layer ", header.layer,
                                " header of transfer ", header.transfer_id));
}

absl::Status SendCudaIpcLanded(int fd, uint64_t transfer_id, int64_t layer,
                               const SocketIoOptions& io) {
  KvFrame f =
      StatusFrame(KvFrameKind::kStatus, transfer_id, absl::OkStatus(), "");
  f.header.layer = layer;
  return SendFrame(fd, f, "", {}, io,
                   absl::StrCat("reporting KV layer ", layer,
                                " landed for transfer ", transfer_id));
}

absl::Status SendCudaIpcFinish(int fd, uint64_t transfer_id,
                               const SocketIoOptions& io) {
  KvFrame f;
  f.kind = KvFrameKind::kFinish;
  f.header.transfer_id = transfer_id;
  return SendFrame(fd, f, "", {}, io, "sending KV finish");
}

absl::Status SendCudaIpcAbort(int fd, uint64_t transfer_id,
                              const absl::Status& reason,
                              const SocketIoOptions& io) {
  const absl::string_view msg = reason.message().substr(0, kKvMaxMessageBytes);
  return SendFrame(fd,
                   StatusFrame(KvFrameKind::kAbort, transfer_id, reason, msg),
                   msg, {}, io, "sending KV abort");
}

absl::Status SendCudaIpcVerdict(int fd, uint64_t transfer_id,
                                const absl::Status& status,
                                const std::optional<CudaIpcGrant>& grant,
                                const SocketIoOptions& io) {
  const absl::string_view msg = status.message().substr(0, kKvMaxMessageBytes);
  std::vector<uint8_t> tail(4);
  if (grant.has_value()) {
    std::vector<uint8_t> g = EncodeCudaIpcGrant(*grant);
    Put32(tail.data(), static_cast<uint32_t>(g.size()));
    tail.insert(tail.end(), g.begin(), g.end());
  } else {
    Put32(tail.data(), 0);
  }
  return SendFrame(fd,
                   StatusFrame(KvFrameKind::kStatus, transfer_id, status, msg),
                   msg, tail, io, "sending KV verdict");
}

absl::StatusOr<CudaIpcVerdict> ReadCudaIpcVerdict(int fd,
                                                  const SocketIoOptions& io) {
  KvFrameBytes bytes;
  BATON_RETURN_IF_ERROR(
      RecvExact(fd, bytes, io, "reading the KV receiver's verdict"));
  BATON_ASSIGN_OR_RETURN(KvFrame f, DecodeKvFrame(bytes));
  if (f.kind != KvFrameKind::kStatus) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV receiver sent frame kind ", static_cast<int>(f.kind),
                     " instead of a status"));
  }
  std::string msg(f.header.payload_bytes, '\0');
  uint8_t len_bytes[4];
  iovec iov[2] = {{msg.data(), msg.size()}, {len_bytes, sizeof(len_bytes)}};
  BATON_RETURN_IF_ERROR(
      RecvAllV(fd, iov, 2, io, "reading the KV receiver's verdict message"));
  const uint32_t grant_bytes = Get32(len_bytes);
  constexpr uint64_t kMaxGrantBytes =
      kCudaIpcGrantHeaderBytes + uint64_t{4} * kCudaIpcMaxGrantBlocks;
  if (grant_bytes > kMaxGrantBytes ||
      (grant_bytes != 0 && f.status_code != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV receiver's verdict carries a grant of ", grant_bytes,
                     " bytes with status code ", f.status_code, " (at most ",
                     kMaxGrantBytes, ", and only with OK)"));
  }
  CudaIpcVerdict v;
  v.transfer_id = f.header.transfer_id;
  if (f.status_code != 0) {
    v.status = absl::Status(static_cast<absl::StatusCode>(f.status_code), msg);
  }
  if (grant_bytes > 0) {
    std::vector<uint8_t> g(grant_bytes);
    BATON_RETURN_IF_ERROR(
        RecvExact(fd, g, io, "reading the KV receiver's grant"));
    BATON_ASSIGN_OR_RETURN(v.grant, DecodeCudaIpcGrant(g));
  }
  return v;
}

}  // namespace baton
