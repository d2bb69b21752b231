// Shared by socket_io.cc and socket_io_tls.cc only.
#ifndef BATON_WORKER_TRANSPORT_SOCKET_IO_INTERNAL_H_
#define BATON_WORKER_TRANSPORT_SOCKET_IO_INTERNAL_H_

#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <span>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "worker/transport/socket_io.h"

namespace baton::socket_io_internal {

// Reads take at most this much per call, so on_data sees bytes while they
// are still in the L2 cache the kernel copied them through.
inline constexpr size_t kRecvSliceBytes = size_t{256} << 10;

// errno as a status: Unavailable for a peer that went away, else Internal.
absl::Status ErrnoStatus(int err, absl::string_view what);

// RecvExact, RecvAllV and SendAllV over stream.tls (set).
absl::Status TlsRecvExact(KvStream stream, std::span<uint8_t> out,
                          const SocketIoOptions& options,
                          absl::string_view what, bool* clean_eof);
absl::Status TlsRecvAllV(
    KvStream stream, iovec* iov, int count, const SocketIoOptions& options,
    absl::string_view what,
    const std::function<void(std::span<const uint8_t>)>& on_data);
absl::Status TlsSendAllV(KvStream stream, iovec* iov, int count,
                         const SocketIoOptions& options, absl::string_view what,
                         ReadGate* gate, const SendPacer* pacer);

}  // namespace baton::socket_io_internal

#endif  // BATON_WORKER_TRANSPORT_SOCKET_IO_INTERNAL_H_
