// For tests that play a KV receiver by hand over a raw socket: the
// receiver's side of a transfer's opening (kv_wire.h) without checking the
// proof, so the test can then read, stall or drain as it likes.
#ifndef BATON_WORKER_TRANSPORT_KV_TEST_PEER_H_
#define BATON_WORKER_TRANSPORT_KV_TEST_PEER_H_

#include <sys/uio.h>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "worker/transport/kv_wire.h"
#include "worker/transport/socket_io.h"

namespace baton::kvtest {

// Reads the hello, sends a challenge, reads the proof (not checked).
inline absl::Status AnswerHello(int fd, const SocketIoOptions& io) {
  KvFrameBytes bytes;
  BATON_RETURN_IF_ERROR(RecvExact(fd, bytes, io, "reading the hello"));
  BATON_ASSIGN_OR_RETURN(KvFrame hello, DecodeKvFrame(bytes));
  KvNonce nonce = NewKvNonce();
  KvFrame challenge;
  challenge.kind = KvFrameKind::kChallenge;
  challenge.header.transfer_id = hello.header.transfer_id;
  challenge.header.payload_bytes = nonce.size();
  KvFrameBytes out = EncodeKvFrame(challenge);
  iovec iov[2] = {{out.data(), out.size()}, {nonce.data(), nonce.size()}};
  BATON_RETURN_IF_ERROR(SendAllV(fd, iov, 2, io, "sending the challenge"));
  BATON_RETURN_IF_ERROR(RecvExact(fd, bytes, io, "reading the proof"));
  KvProofBytes proof{};
  return RecvExact(fd, proof, io, "reading the proof's bytes");
}

}  // namespace baton::kvtest

#endif  // BATON_WORKER_TRANSPORT_KV_TEST_PEER_H_
