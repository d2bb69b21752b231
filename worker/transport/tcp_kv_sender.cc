#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/fault/fault_points.h"
#include "common/status_macros.h"
#include "worker/transport/kv_handshake.h"
#include "worker/transport/tcp_kv_internal.h"
#include "worker/transport/tcp_kv_transport.h"

namespace baton {

using tcp_kv_internal::AppendIov;
using tcp_kv_internal::kMaxLinger;
using tcp_kv_internal::SendStatusFrame;

// ----------------------------------------------------------------- sender

absl::StatusOr<std::unique_ptr<TcpKvSender>> TcpKvSender::Connect(
    absl::string_view endpoint, uint64_t transfer_id,
    const TcpKvSenderOptions& options) {
  KvConnection conn;
  if (options.pool != nullptr) {
    BATON_ASSIGN_OR_RETURN(
        conn, options.pool->Acquire(endpoint, options.stall_timeout,
                                    options.socket_buffer_bytes));
  } else {
    BATON_ASSIGN_OR_RETURN(conn.fd, TcpConnect(endpoint, options.stall_timeout,
                                               options.socket_buffer_bytes));
  }
  if (options.tls != nullptr && conn.tls == nullptr) {
    SocketIoOptions io;
    io.stall_timeout = options.stall_timeout;
    const absl::string_view host = endpoint.substr(0, endpoint.rfind(':'));
    BATON_ASSIGN_OR_RETURN(conn.tls,
                           options.tls->Connect(conn.fd.get(), host, io));
  }
  std::unique_ptr<TcpKvSender> sender(new TcpKvSender(
      std::move(conn), std::string(endpoint), transfer_id, options));
  if (absl::Status s = sender->ProveInvited(); !s.ok()) {
    sender->done_ = true;  // nothing to abort: the receiver refused it
    return sender->Fail(std::move(s));
  }
  return sender;
}

absl::Status TcpKvSender::ProveInvited() {
  SocketIoOptions io;
  io.stall_timeout = options_.stall_timeout;
  return baton::ProveInvited(conn_.stream(), transfer_id_,
                             options_.transfer_secret, io);
}

TcpKvSender::TcpKvSender(KvConnection connection, std::string endpoint,
                         uint64_t transfer_id,
                         const TcpKvSenderOptions& options)
    : conn_(std::move(connection)),
      endpoint_(std::move(endpoint)),
      transfer_id_(transfer_id),
      options_(options) {}

TcpKvSender::~TcpKvSender() {
  if (!done_) Abort(absl::CancelledError("sender destroyed before Finish"));
}

absl::Status TcpKvSender::Fail(absl::Status status) {
  if (error_.ok()) error_ = std::move(status);
  conn_ = KvConnection();
  return error_;
}

absl::Status TcpKvSender::ReadVerdict(const SocketIoOptions& io) {
  KvFrameBytes bytes;
  BATON_RETURN_IF_ERROR(RecvExact(conn_.stream(), bytes, io,
                                  "reading the KV receiver's verdict"));
  BATON_ASSIGN_OR_RETURN(KvFrame f, DecodeKvFrame(bytes));
  if (f.kind != KvFrameKind::kStatus) {
    return absl::InternalError(absl::StrCat("KV receiver sent frame kind ",
                                            static_cast<int>(f.kind),
                                            " instead of a status"));
  }
  return ReadStatusBody(conn_.stream(), f, transfer_id_, "rejected", io);
}

absl::Status TcpKvSender::SendLayer(const KvTransferHeader& header,
                                    std::span<const uint8_t> payload) {
  if (header.checksum != 0) {
    const std::span<const uint8_t> whole[1] = {payload};
    return SendLayerChunks(header, whole, nullptr);
  }
  // Hashed as it goes out: in the layout's chunks, as KvChecksum cuts it.
  const uint64_t piece = header.layout.chunk_bytes();
  std::vector<std::span<const uint8_t>> chunks;
  for (uint64_t off = 0; off < payload.size(); off += piece) {
    chunks.push_back(
        payload.subspan(off, std::min<uint64_t>(piece, payload.size() - off)));
    if (piece == 0) break;
  }
  return SendLayerChunks(header, chunks, nullptr);
}

absl::Status TcpKvSender::SendLayerChunks(
    const KvTransferHeader& header,
    std::span<const std::span<const uint8_t>> chunks, KvReadGate* gate) {
  if (!error_.ok()) return error_;
  if (done_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KV transfer ", transfer_id_, ": SendLayer after Finish/Abort"));
  }
  // Caller errors: nothing is sent, the transfer stays usable.
  if (header.transfer_id != transfer_id_) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV header transfer_id ", header.transfer_id,
                     " vs this sender's ", transfer_id_));
  }
  uint64_t payload_size = 0;
  for (std::span<const uint8_t> c : chunks) payload_size += c.size();
  if (header.payload_bytes != payload_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV header payload_bytes ", header.payload_bytes,
                     " vs payload size ", payload_size));
  }
  if (header.request_id.size() > kKvMaxIdBytes ||
      header.model_id.size() > kKvMaxIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV header request_id / model_id longer than ", kKvMaxIdBytes));
  }
  // An early verdict (the receiver rejected an earlier layer) is readable.
  pollfd pfd{conn_.fd.get(), POLLIN, 0};
  if (poll(&pfd, 1, 0) > 0) {
    SocketIoOptions io;
    io.stall_timeout = options_.stall_timeout;
    absl::Status verdict = ReadVerdict(io);
    if (verdict.ok()) {
      verdict = absl::InternalError(absl::StrCat(
          "KV receiver ended transfer ", transfer_id_, " before Finish"));
    }
    return Fail(verdict);
  }
  if (options_.simulated_layers) return SendSimulatedLayer(header);
  // Test-only (--fault=kv_layer_corrupt:error): one bit of this layer's
  // checksum flipped, which the receiver cannot tell from a corrupted
  // payload byte.
  const uint64_t flip =
      FaultPoints::Global().Hit(kFaultKvLayerCorrupt).ok() ? 0 : 1;
  KvFrame f;
  f.kind = KvFrameKind::kLayer;
  f.header = header;
  KvFrameBytes bytes = EncodeKvFrame(f);
  std::string ids = header.request_id + header.model_id;
  KvTrailerBytes trailer = EncodeKvTrailer(header.checksum ^ flip);
  iov_.clear();
  iov_.push_back({bytes.data(), bytes.size()});
  AppendIov(ids.data(), ids.size(), &iov_);
  for (std::span<const uint8_t> c : chunks) {
    AppendIov(c.data(), c.size(), &iov_);
  }
  iov_.push_back({trailer.data(), trailer.size()});
  // Checksum 0: each chunk is hashed just before the sendmsg that first
  // offers one of its bytes (so the kernel copies it out of cache), and the
  // trailer is filled once the last chunk is hashed.
  SendPacer pacer;
  const uint64_t prefix = bytes.size() + ids.size();
  size_t next_chunk = 0;
  uint64_t next_start = prefix;
  bool trailer_ready = header.checksum != 0;
  if (!trailer_ready) {
    checksummer_.Reset();
    pacer.max_call_bytes = options_.send_call_bytes;
    pacer.prepare = [&](uint64_t end) {
      while (next_chunk < chunks.size() && next_start < end) {
        checksummer_.AddChunk(chunks[next_chunk]);
        next_start += chunks[next_chunk++].size();
      }
      if (!trailer_ready && end > prefix + payload_size) {
        trailer = EncodeKvTrailer(checksummer_.Digest() ^ flip);
        trailer_ready = true;
      }
    };
  }
  SocketIoOptions io;
  io.stall_timeout = options_.stall_timeout;
  absl::Status s =
      SendAllV(conn_.stream(), iov_.data(), static_cast<int>(iov_.size()), io,
               absl::StrCat("sending KV layer ", header.layer, " of transfer ",
                            transfer_id_),
               gate, trailer_ready ? nullptr : &pacer);
  if (!s.ok() && absl::IsUnavailable(s)) {
    // The receiver may have said why before closing.
    SocketIoOptions quick;
    quick.stall_timeout = absl::Milliseconds(100);
    absl::Status verdict = ReadVerdict(quick);
    if (!verdict.ok() && !absl::IsUnavailable(verdict) &&
        !absl::IsDeadlineExceeded(verdict)) {
      s = verdict;
    }
  }
  // A revoked gate may leave a frame cut short: Fail closes the connection,
  // so the receiver sees a disconnect, never a misframed stream.
  if (!s.ok()) return Fail(s);
  return absl::OkStatus();
}

absl::Status TcpKvSender::SendSimulatedLayer(const KvTransferHeader& header) {
  KvFrame f;
  f.kind = KvFrameKind::kSimulatedLayer;
  f.header = header;
  KvFrameBytes bytes = EncodeKvFrame(f);
  std::string ids = header.request_id + header.model_id;
  iovec iov[2] = {{bytes.data(), bytes.size()}, {ids.data(), ids.size()}};
  SocketIoOptions io;
  io.stall_timeout = options_.stall_timeout;
  absl::Status s =
      SendAllV(conn_.stream(), iov, ids.empty() ? 1 : 2, io,
               absl::StrCat("sending simulated KV layer ", header.layer,
                            " of transfer ", transfer_id_));
  if (!s.ok()) return Fail(s);
  return absl::OkStatus();
}

absl::Status TcpKvSender::Finish() {
  if (!error_.ok()) return error_;
  if (done_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KV transfer ", transfer_id_, ": Finish after Finish/Abort"));
  }
  done_ = true;
  KvFrame f;
  f.kind = KvFrameKind::kFinish;
  f.header.transfer_id = transfer_id_;
  KvFrameBytes bytes = EncodeKvFrame(f);
  iovec iov[1] = {{bytes.data(), bytes.size()}};
  SocketIoOptions io;
  io.stall_timeout = options_.stall_timeout;
  absl::Status sent = SendAllV(conn_.stream(), iov, 1, io, "sending KV finish");
  // Even if the send failed, the receiver may have left a verdict.
  absl::Status verdict = ReadVerdict(io);
  if (!verdict.ok()) return Fail(sent.ok() ? verdict : sent);
  if (!sent.ok()) return Fail(sent);
  // OK verdict: the stream is at a frame boundary, the connection reusable.
  if (options_.pool != nullptr) {
    options_.pool->Release(endpoint_, std::move(conn_));
  }
  conn_ = KvConnection();
  return absl::OkStatus();
}

void TcpKvSender::Abort(absl::Status reason) {
  if (done_ || conn_.fd.get() < 0) {
    done_ = true;
    return;
  }
  done_ = true;
  if (reason.ok()) reason = absl::CancelledError("aborted by sender");
  SocketIoOptions io;
  io.stall_timeout = options_.stall_timeout;
  SendStatusFrame(conn_.stream(), KvFrameKind::kAbort, transfer_id_, reason, io)
      .IgnoreError();
  Fail(PrefixStatus(absl::StrCat("KV transfer ", transfer_id_, " aborted: "),
                    reason))
      .IgnoreError();
}

}  // namespace baton
