#include "worker/transport/kv_handshake.h"

#include <sys/uio.h>

#include <span>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace baton {

absl::Status ReadStatusBody(KvStream stream, const KvFrame& frame,
                            uint64_t transfer_id, absl::string_view verb,
                            const SocketIoOptions& io) {
  std::string msg(frame.header.payload_bytes, '\0');
  BATON_RETURN_IF_ERROR(RecvExact(
      stream,
      std::span<uint8_t>(reinterpret_cast<uint8_t*>(msg.data()), msg.size()),
      io,
      absl::StrCat("reading the KV receiver's message on transfer ",
                   transfer_id)));
  if (frame.status_code == 0) return absl::OkStatus();
  return absl::Status(
      static_cast<absl::StatusCode>(frame.status_code),
      absl::StrCat("KV receiver ", verb, " transfer ", transfer_id, ": ", msg));
}

namespace {

// One handshake frame of `kind` for `transfer_id` with `payload`.
absl::Status SendHandshakeFrame(KvStream stream, KvFrameKind kind,
                                uint64_t transfer_id,
                                std::span<const uint8_t> payload,
                                const SocketIoOptions& io,
                                absl::string_view what) {
  KvFrame frame;
  frame.kind = kind;
  frame.header.transfer_id = transfer_id;
  frame.header.payload_bytes = payload.size();
  KvFrameBytes bytes = EncodeKvFrame(frame);
  iovec iov[2] = {{bytes.data(), bytes.size()},
                  {const_cast<uint8_t*>(payload.data()), payload.size()}};
  return SendAllV(stream, iov, payload.empty() ? 1 : 2, io,
                  absl::StrCat(what, " of KV transfer ", transfer_id));
}

}  // namespace

absl::Status ProveInvited(KvStream stream, uint64_t transfer_id,
                          absl::string_view secret, const SocketIoOptions& io) {
  BATON_RETURN_IF_ERROR(SendHandshakeFrame(
      stream, KvFrameKind::kHello, transfer_id, {}, io, "sending the hello"));
  KvFrameBytes bytes;
  BATON_RETURN_IF_ERROR(RecvExact(
      stream, bytes, io,
      absl::StrCat("reading the challenge for KV transfer ", transfer_id)));
  BATON_ASSIGN_OR_RETURN(KvFrame f, DecodeKvFrame(bytes));
  if (f.kind == KvFrameKind::kStatus) {
    absl::Status refused =
        ReadStatusBody(stream, f, transfer_id, "refused", io);
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
      RecvExact(stream, nonce, io,
                absl::StrCat("reading the challenge nonce of KV transfer ",
                             transfer_id)));
  const KvProofBytes proof = KvProof(secret, nonce, transfer_id);
  return SendHandshakeFrame(stream, KvFrameKind::kProof, transfer_id, proof, io,
                            "sending the proof");
}

absl::Status ChallengeSender(KvStream stream, uint64_t transfer_id,
                             const KvSecretFn& secret_of,
                             const SocketIoOptions& io) {
  const KvNonce nonce = NewKvNonce();
  BATON_RETURN_IF_ERROR(SendHandshakeFrame(stream, KvFrameKind::kChallenge,
                                           transfer_id, nonce, io,
                                           "sending the challenge"));
  KvFrameBytes bytes;
  BATON_RETURN_IF_ERROR(
      RecvExact(stream, bytes, io, "waiting for the KV sender's proof"));
  BATON_ASSIGN_OR_RETURN(KvFrame f, DecodeKvFrame(bytes));
  if (f.kind != KvFrameKind::kProof || f.header.transfer_id != transfer_id) {
    return absl::UnauthenticatedError(absl::StrCat(
        "KV transfer ", transfer_id, ": frame kind ", static_cast<int>(f.kind),
        " of transfer ", f.header.transfer_id, " instead of the proof"));
  }
  KvProofBytes proof{};
  BATON_RETURN_IF_ERROR(
      RecvExact(stream, proof, io, "reading the KV sender's proof"));
  if (!secret_of) return absl::OkStatus();
  BATON_ASSIGN_OR_RETURN(const std::string secret, secret_of(transfer_id));
  if (!KvProofMatches(secret, nonce, transfer_id, proof)) {
    return absl::UnauthenticatedError(absl::StrCat(
        "KV transfer ", transfer_id,
        ": the sender's proof does not match the reservation's secret"));
  }
  return absl::OkStatus();
}

absl::Status LiveTransfers::Claim(uint64_t transfer_id) {
  absl::MutexLock lock(&mu_);
  if (!ids_.insert(transfer_id).second) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV transfer ", transfer_id,
                     " is being received on another connection"));
  }
  return absl::OkStatus();
}

void LiveTransfers::Release(uint64_t transfer_id) {
  absl::MutexLock lock(&mu_);
  ids_.erase(transfer_id);
}

}  // namespace baton
