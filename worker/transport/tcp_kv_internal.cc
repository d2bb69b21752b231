#include "worker/transport/tcp_kv_internal.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace baton::tcp_kv_internal {

absl::Status SendStatusFrame(int fd, KvFrameKind kind, uint64_t transfer_id,
                             const absl::Status& status,
                             const SocketIoOptions& io) {
  KvFrame f;
  f.kind = kind;
  f.header.transfer_id = transfer_id;
  f.status_code = static_cast<uint32_t>(status.code());
  absl::string_view msg = status.message();
  msg = msg.substr(0, kKvMaxMessageBytes);
  f.header.payload_bytes = msg.size();
  KvFrameBytes bytes = EncodeKvFrame(f);
  iovec iov[2] = {{bytes.data(), bytes.size()},
                  {const_cast<char*>(msg.data()), msg.size()}};
  return SendAllV(fd, iov, 2, io, "sending KV status frame");
}

absl::Status ReadStatusBody(int fd, const KvFrame& frame, uint64_t transfer_id,
                            absl::string_view verb, const SocketIoOptions& io) {
  std::string msg(frame.header.payload_bytes, '\0');
  BATON_RETURN_IF_ERROR(RecvExact(
      fd,
      std::span<uint8_t>(reinterpret_cast<uint8_t*>(msg.data()), msg.size()),
      io,
      absl::StrCat("reading the KV receiver's message on transfer ",
                   transfer_id)));
  if (frame.status_code == 0) return absl::OkStatus();
  return absl::Status(
      static_cast<absl::StatusCode>(frame.status_code),
      absl::StrCat("KV receiver ", verb, " transfer ", transfer_id, ": ", msg));
}

absl::Status ProveInvited(int fd, uint64_t transfer_id,
                          absl::string_view secret, const SocketIoOptions& io) {
  KvFrame hello;
  hello.kind = KvFrameKind::kHello;
  hello.header.transfer_id = transfer_id;
  KvFrameBytes hello_bytes = EncodeKvFrame(hello);
  iovec hello_iov[1] = {{hello_bytes.data(), hello_bytes.size()}};
  BATON_RETURN_IF_ERROR(
      SendAllV(fd, hello_iov, 1, io,
               absl::StrCat("sending the hello of KV transfer ", transfer_id)));
  KvFrameBytes bytes;
  BATON_RETURN_IF_ERROR(RecvExact(
      fd, bytes, io,
      absl::StrCat("reading the challenge for KV transfer ", transfer_id)));
  BATON_ASSIGN_OR_RETURN(KvFrame f, DecodeKvFrame(bytes));
  if (f.kind == KvFrameKind::kStatus) {
    absl::Status refused = ReadStatusBody(fd, f, transfer_id, "refused", io);
    if (refused.ok()) {
      return absl::InternalError(absl::StrCat(
          "KV receiver answered the hello of transfer ", transfer_id,
          " with an OK status instead of a challenge"));
    }
    return refused;
  }
  if (f.kind != KvFrameKind::kChallenge ||
      f.header.transfer_id != transfer_id) {
    return absl::InternalError(
        absl::StrCat("KV receiver answered the hello of transfer ", transfer_id,
                     " with frame kind ", static_cast<int>(f.kind),
                     " of transfer ", f.header.transfer_id));
  }
  KvNonce nonce{};
  BATON_RETURN_IF_ERROR(
      RecvExact(fd, nonce, io,
                absl::StrCat("reading the challenge nonce of KV transfer ",
                             transfer_id)));
  KvProofBytes proof = KvProof(secret, nonce, transfer_id);
  KvFrame proof_frame;
  proof_frame.kind = KvFrameKind::kProof;
  proof_frame.header.transfer_id = transfer_id;
  proof_frame.header.payload_bytes = proof.size();
  KvFrameBytes proof_bytes = EncodeKvFrame(proof_frame);
  iovec proof_iov[2] = {{proof_bytes.data(), proof_bytes.size()},
                        {proof.data(), proof.size()}};
  return SendAllV(
      fd, proof_iov, 2, io,
      absl::StrCat("sending the proof of KV transfer ", transfer_id));
}

void AppendIov(const void* base, size_t len, std::vector<iovec>* iov) {
  if (len == 0) return;
  void* p = const_cast<void*>(base);
  if (!iov->empty()) {
    iovec& last = iov->back();
    if (static_cast<uint8_t*>(last.iov_base) + last.iov_len == p) {
      last.iov_len += len;
      return;
    }
  }
  iov->push_back({p, len});
}

}  // namespace baton::tcp_kv_internal
