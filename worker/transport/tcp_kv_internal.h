// Pieces the TCP KV sender and receiver share.
#ifndef BATON_WORKER_TRANSPORT_TCP_KV_INTERNAL_H_
#define BATON_WORKER_TRANSPORT_TCP_KV_INTERNAL_H_

#include <sys/uio.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "worker/transport/kv_wire.h"
#include "worker/transport/socket_io.h"

namespace baton::tcp_kv_internal {

// How long a receiver lingers after sending an error, draining the sender's
// bytes so the sender reads the error instead of a reset.
inline constexpr absl::Duration kMaxLinger = absl::Seconds(2);

// Sends a status (or abort) frame; best effort, bounded by io.
absl::Status SendStatusFrame(KvStream stream, KvFrameKind kind,
                             uint64_t transfer_id, const absl::Status& status,
                             const SocketIoOptions& io);

// Appends [base, base + len) to iov, merged into the last entry when it
// continues it (adjacent block ids are adjacent in a layer of the pool).
void AppendIov(const void* base, size_t len, std::vector<iovec>* iov);

}  // namespace baton::tcp_kv_internal

#endif  // BATON_WORKER_TRANSPORT_TCP_KV_INTERNAL_H_
