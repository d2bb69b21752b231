// The opening of a KV transfer on a TCP connection (the TCP and CUDA IPC
// transports; kv_wire.h): the sender proves it holds the reservation's
// secret before the receiver claims or writes anything, and a receiver lets
// one connection at a time write a transfer.
#ifndef BATON_WORKER_TRANSPORT_KV_HANDSHAKE_H_
#define BATON_WORKER_TRANSPORT_KV_HANDSHAKE_H_

#include <cstdint>
#include <functional>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "worker/transport/kv_wire.h"
#include "worker/transport/socket_io.h"

namespace baton {

// A transfer's secret by id (KvReceiverCallbacks::secret).
using KvSecretFn =
    std::function<absl::StatusOr<std::string>(uint64_t transfer_id)>;

// The sender's side: hello, the receiver's challenge, the proof of
// `secret`. The receiver's refusal comes back as its status (code kept).
absl::Status ProveInvited(KvStream stream, uint64_t transfer_id,
                          absl::string_view secret, const SocketIoOptions& io);

// The receiver's side, once the hello of `transfer_id` was read: a fresh
// challenge, then the sender's proof, checked against secret(transfer_id)
// (null `secret`: any proof is accepted, for tests of the data path alone).
// Unauthenticated when the proof is missing or does not match; the lookup's
// error (e.g. NotFound) when there is no secret for the transfer.
absl::Status ChallengeSender(KvStream stream, uint64_t transfer_id,
                             const KvSecretFn& secret,
                             const SocketIoOptions& io);

// The rest of a status frame whose header `frame` was read: its message
// (frame.header.payload_bytes, bounded by DecodeKvFrame). OK for code 0;
// otherwise the frame's code with "KV receiver <verb> transfer N: message".
absl::Status ReadStatusBody(KvStream stream, const KvFrame& frame,
                            uint64_t transfer_id, absl::string_view verb,
                            const SocketIoOptions& io);

// The transfers a receiver's connections are writing: a second connection
// quoting one of them is refused without touching the first.
class LiveTransfers {
 public:
  // FailedPrecondition if another connection holds `transfer_id`.
  absl::Status Claim(uint64_t transfer_id);
  void Release(uint64_t transfer_id);

 private:
  absl::Mutex mu_;
  std::set<uint64_t> ids_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_WORKER_TRANSPORT_KV_HANDSHAKE_H_
