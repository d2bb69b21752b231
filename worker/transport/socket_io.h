// Blocking-with-deadline I/O on non-blocking TCP sockets, for the host KV
// transport, in the clear or over TLS (KvStream). Every wait is bounded by a
// stall timeout (no progress for that long -> DeadlineExceeded) and can be
// interrupted through a cancel fd (readable -> Cancelled). A closed or reset
// peer -> Unavailable.
#ifndef BATON_WORKER_TRANSPORT_SOCKET_IO_H_
#define BATON_WORKER_TRANSPORT_SOCKET_IO_H_

#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

struct ssl_st;  // OpenSSL's SSL

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

// OpenSSL's TLS session (SSL), owned.
struct SslFree {
  void operator()(ssl_st* ssl) const;
};
using UniqueSsl = std::unique_ptr<ssl_st, SslFree>;

// OpenSSL's queued errors of this thread, oldest first ("" if none); empties
// the queue.
std::string TakeTlsErrors();

// The byte stream of a connection: the socket itself, or a TLS session over
// it (`tls` set; the socket stays non-blocking and is what waits poll).
struct KvStream {
  KvStream(int fd) : fd(fd) {}  // NOLINT(runtime/explicit): a plain socket
  KvStream(int fd, ssl_st* tls) : fd(fd), tls(tls) {}
  int fd = -1;
  ssl_st* tls = nullptr;
};

// A KV connection: its socket and, with --kv_tls, the TLS session over it.
struct KvConnection {
  UniqueFd fd;
  UniqueSsl tls;
  KvStream stream() const { return KvStream(fd.get(), tls.get()); }
};

// Brackets every read of memory whose owner may take it back while a sender
// waits for the peer (a KV pool's blocks at a handoff timeout). Enter() true:
// the memory may be read until the matching Exit(); false: access is revoked
// for good and the memory must never be read again. Enter/Exit pairs do not
// nest and are called from one thread.
class ReadGate {
 public:
  virtual ~ReadGate() = default;
  virtual bool Enter() = 0;
  virtual void Exit() = 0;
};

// Waits until fd has `events` (POLLIN / POLLOUT). `what` names the operation
// in errors.
absl::Status WaitFd(int fd, short events, const SocketIoOptions& options,
                    absl::string_view what);

// Reads exactly out.size() bytes. If the peer closes before the first byte
// and `clean_eof` is non-null, sets *clean_eof = true and returns OK.
absl::Status RecvExact(KvStream stream, std::span<uint8_t> out,
                       const SocketIoOptions& options, absl::string_view what,
                       bool* clean_eof = nullptr);

// Reads exactly the bytes of iov[0..count) (scatter, in order) with recvmsg.
// on_data, if set, sees every newly filled range right after it lands, in
// stream order (e.g. to checksum bytes while they are in cache). Modifies the
// iovec array. Any count (batches of at most IOV_MAX per call).
absl::Status RecvAllV(
    KvStream stream, iovec* iov, int count, const SocketIoOptions& options,
    absl::string_view what,
    const std::function<void(std::span<const uint8_t>)>& on_data = nullptr);

// Lets a sender finish bytes of the stream just before they go out (e.g.
// hash a chunk while it is in cache, then fill in a trailer).
struct SendPacer {
  // Each sendmsg is offered at most this many bytes; 0 = no limit.
  size_t max_call_bytes = 0;
  // Called before every sendmsg (inside the gate, if any) with the stream
  // offset, counted from the first byte of the iovecs passed to SendAllV,
  // up to which that call may write; it must make every byte before `end`
  // final. Offsets never decrease from one call to the next.
  std::function<void(uint64_t end)> prepare;
};

// Writes every byte of iov[0..count) with sendmsg(MSG_NOSIGNAL), no copies.
// Modifies the iovec array. Any count (batches of at most IOV_MAX per call).
// Over TLS: one SSL_write per call of at most max_call_bytes of one iovec;
// runs of iovecs under 16 KiB are first gathered into one record.
// With a gate, every sendmsg runs between gate->Enter() and gate->Exit()
// (never a wait for the peer), and a revoked gate ends the send with
// Cancelled; the stream may then stop mid-frame, so the caller must close
// the connection. With a pacer, calls are sized and prepared as it says.
absl::Status SendAllV(KvStream stream, iovec* iov, int count,
                      const SocketIoOptions& options, absl::string_view what,
                      ReadGate* gate = nullptr,
                      const SendPacer* pacer = nullptr);

// Connected non-blocking TCP socket with TCP_NODELAY. `endpoint` is
// "host:port" (IPv4 dotted quad or a resolvable name). buffer_bytes > 0
// sets SO_SNDBUF and SO_RCVBUF before connecting (the kernel caps them at
// net.core.{w,r}mem_max); 0 keeps the kernel's autotuning.
absl::StatusOr<UniqueFd> TcpConnect(absl::string_view endpoint,
                                    absl::Duration timeout,
                                    int buffer_bytes = 0);

// Listening non-blocking socket bound to host:port (port 0 = any); *bound_port
// receives the chosen port. buffer_bytes as for TcpConnect, set on the
// listening socket so accepted connections inherit it.
absl::StatusOr<UniqueFd> TcpListen(absl::string_view host, int port,
                                   int* bound_port, int buffer_bytes = 0);

}  // namespace baton

#endif  // BATON_WORKER_TRANSPORT_SOCKET_IO_H_
