// Blocking-with-deadline I/O on non-blocking TCP sockets, for the host KV
// transport. Every wait is bounded by a stall timeout (no progress for that
// long -> DeadlineExceeded) and can be interrupted through a cancel fd
// (readable -> Cancelled). A closed or reset peer -> Unavailable.
#ifndef BATON_WORKER_TRANSPORT_SOCKET_IO_H_
#define BATON_WORKER_TRANSPORT_SOCKET_IO_H_

#include <sys/uio.h>

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace baton {

struct SocketIoOptions {
  absl::Duration stall_timeout = absl::Seconds(10);
  int cancel_fd = -1;  // optional; readable means "give up"
};

// Owns a file descriptor; closes it on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.Release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }
  int get() const { return fd_; }
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Reset();

 private:
  int fd_ = -1;
};

// Waits until fd has `events` (POLLIN / POLLOUT). `what` names the operation
// in errors.
absl::Status WaitFd(int fd, short events, const SocketIoOptions& options,
                    absl::string_view what);

// Reads exactly out.size() bytes. If the peer closes before the first byte
// and `clean_eof` is non-null, sets *clean_eof = true and returns OK.
absl::Status RecvExact(int fd, std::span<uint8_t> out,
                       const SocketIoOptions& options, absl::string_view what,
                       bool* clean_eof = nullptr);

// Writes every byte of iov[0..count) with sendmsg(MSG_NOSIGNAL), no copies.
// Modifies the iovec array.
absl::Status SendAllV(int fd, iovec* iov, int count,
                      const SocketIoOptions& options, absl::string_view what);

// Connected non-blocking TCP socket with TCP_NODELAY. `endpoint` is
// "host:port" (IPv4 dotted quad or a resolvable name).
absl::StatusOr<UniqueFd> TcpConnect(absl::string_view endpoint,
                                    absl::Duration timeout);

// Listening non-blocking socket bound to host:port (port 0 = any); *bound_port
// receives the chosen port.
absl::StatusOr<UniqueFd> TcpListen(absl::string_view host, int port,
                                   int* bound_port);

}  // namespace baton

#endif  // BATON_WORKER_TRANSPORT_SOCKET_IO_H_
