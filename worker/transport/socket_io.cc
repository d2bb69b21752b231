#include "worker/transport/socket_io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "worker/transport/socket_io_internal.h"

namespace baton {
namespace socket_io_internal {

absl::Status ErrnoStatus(int err, absl::string_view what) {
  const std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  if (err == EPIPE || err == ECONNRESET || err == ECONNREFUSED ||
      err == ENOTCONN || err == ECONNABORTED || err == EHOSTUNREACH ||
      err == ENETUNREACH) {
    return absl::UnavailableError(msg);
  }
  return absl::InternalError(msg);
}

}  // namespace socket_io_internal

namespace {

using socket_io_internal::ErrnoStatus;
using socket_io_internal::kRecvSliceBytes;
using socket_io_internal::TlsRecvAllV;
using socket_io_internal::TlsRecvExact;
using socket_io_internal::TlsSendAllV;

absl::Status SetNonBlocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return ErrnoStatus(errno, "fcntl(O_NONBLOCK)");
  }
  return absl::OkStatus();
}

// Largest iovec count one sendmsg / recvmsg accepts.
#ifdef IOV_MAX
constexpr int kMaxIov = IOV_MAX;
#else
constexpr int kMaxIov = 1024;
#endif

// Drops the first n bytes of iov[0..*count), advancing *iov.
void Consume(iovec** iov, int* count, size_t n) {
  while (*count > 0 && n >= (*iov)[0].iov_len) {
    n -= (*iov)[0].iov_len;
    ++*iov;
    --*count;
  }
  if (*count > 0) {
    (*iov)[0].iov_base = static_cast<uint8_t*>((*iov)[0].iov_base) + n;
    (*iov)[0].iov_len -= n;
  }
}

// Fixed send and receive buffers (best effort); 0 keeps autotuning.
void SetBuffers(int fd, int bytes) {
  if (bytes <= 0) return;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

int PollMillis(absl::Duration d) {
  const int64_t ms =
      absl::ToInt64Milliseconds(absl::Ceil(d, absl::Milliseconds(1)));
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(ms, 0), 1 << 30));
}

absl::StatusOr<sockaddr_in> Resolve(absl::string_view host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const std::string h(host);
  if (inet_pton(AF_INET, h.c_str(), &addr.sin_addr) == 1) return addr;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(h.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve host '", host, "'"));
  }
  addr.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return addr;
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    Reset();
    fd_ = o.Release();
  }
  return *this;
}

void UniqueFd::Reset() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::Status WaitFd(int fd, short events, const SocketIoOptions& options,
                    absl::string_view what) {
  pollfd fds[2] = {{fd, events, 0}, {options.cancel_fd, POLLIN, 0}};
  const nfds_t n = options.cancel_fd >= 0 ? 2 : 1;
  const absl::Time deadline = absl::Now() + options.stall_timeout;
  while (true) {
    const int rc = poll(fds, n, PollMillis(deadline - absl::Now()));
    if (rc < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat("poll while ", what));
    }
    if (n == 2 && fds[1].revents != 0) {
      return absl::CancelledError(
          absl::StrCat("cancelled (shutting down) while ", what));
    }
    // Errors and hang-ups surface through the following recv/send.
    if (fds[0].revents != 0) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no progress for ", absl::FormatDuration(options.stall_timeout),
          " while ", what));
    }
  }
}

absl::Status RecvExact(KvStream stream, std::span<uint8_t> out,
                       const SocketIoOptions& options, absl::string_view what,
                       bool* clean_eof) {
  if (clean_eof != nullptr) *clean_eof = false;
  if (stream.tls != nullptr) {
    return TlsRecvExact(stream, out, options, what, clean_eof);
  }
  const int fd = stream.fd;
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = recv(fd, out.data() + got, out.size() - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      if (got == 0 && clean_eof != nullptr) {
        *clean_eof = true;
        return absl::OkStatus();
      }
      return absl::UnavailableError(
          absl::StrCat("peer closed the connection after ", got, " of ",
                       out.size(), " bytes while ", what));
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (absl::Status s = WaitFd(fd, POLLIN, options, what); !s.ok()) {
        return s;
      }
      continue;
    }
    return ErrnoStatus(errno, absl::StrCat("recv after ", got, " of ",
                                           out.size(), " bytes while ", what));
  }
  return absl::OkStatus();
}

absl::Status RecvAllV(
    KvStream stream, iovec* iov, int count, const SocketIoOptions& options,
    absl::string_view what,
    const std::function<void(std::span<const uint8_t>)>& on_data) {
  if (stream.tls != nullptr) {
    return TlsRecvAllV(stream, iov, count, options, what, on_data);
  }
  const int fd = stream.fd;
  size_t total = 0;
  for (int i = 0; i < count; ++i) total += iov[i].iov_len;
  size_t got = 0;
  while (count > 0 && iov[0].iov_len == 0) {
    ++iov;
    --count;
  }
  while (count > 0) {
    // One slice: at most kRecvSliceBytes over at most kMaxIov iovecs; the
    // last iovec is shortened in place and restored after the call.
    int n_iov = 0;
    size_t slice = 0;
    while (n_iov < count && n_iov < kMaxIov && slice < kRecvSliceBytes) {
      slice += iov[n_iov].iov_len;
      ++n_iov;
    }
    const size_t last_len = iov[n_iov - 1].iov_len;
    if (slice > kRecvSliceBytes) {
      iov[n_iov - 1].iov_len -= slice - kRecvSliceBytes;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n_iov);
    const ssize_t n = recvmsg(fd, &msg, 0);
    iov[n_iov - 1].iov_len = last_len;
    if (n > 0) {
      size_t left = static_cast<size_t>(n);
      got += left;
      if (on_data) {
        for (int i = 0; i < n_iov && left > 0; ++i) {
          const size_t take = std::min(left, iov[i].iov_len);
          on_data(std::span<const uint8_t>(
              static_cast<const uint8_t*>(iov[i].iov_base), take));
          left -= take;
        }
      }
      Consume(&iov, &count, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) {
      return absl::UnavailableError(
          absl::StrCat("peer closed the connection after ", got, " of ", total,
                       " bytes while ", what));
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (absl::Status s = WaitFd(fd, POLLIN, options, what); !s.ok()) {
        return s;
      }
      continue;
    }
    return ErrnoStatus(errno, absl::StrCat("recvmsg after ", got, " of ", total,
                                           " bytes while ", what));
  }
  return absl::OkStatus();
}

absl::Status SendAllV(KvStream stream, iovec* iov, int count,
                      const SocketIoOptions& options, absl::string_view what,
                      ReadGate* gate, const SendPacer* pacer) {
  if (stream.tls != nullptr) {
    return TlsSendAllV(stream, iov, count, options, what, gate, pacer);
  }
  const int fd = stream.fd;
  while (count > 0 && iov[0].iov_len == 0) {
    ++iov;
    --count;
  }
  const size_t max_call = pacer != nullptr && pacer->max_call_bytes > 0
                              ? pacer->max_call_bytes
                              : SIZE_MAX;
  uint64_t sent = 0;
  while (count > 0) {
    // One call: at most max_call bytes over at most kMaxIov iovecs; the last
    // iovec is shortened in place and restored after the call.
    int n_iov = 0;
    size_t offer = 0;
    while (n_iov < count && n_iov < kMaxIov && offer < max_call) {
      offer += iov[n_iov].iov_len;
      ++n_iov;
    }
    const size_t last_len = iov[n_iov - 1].iov_len;
    if (offer > max_call) {
      iov[n_iov - 1].iov_len -= offer - max_call;
      offer = max_call;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n_iov);
    if (gate != nullptr && !gate->Enter()) {
      iov[n_iov - 1].iov_len = last_len;
      return absl::CancelledError(
          absl::StrCat("source memory released while ", what));
    }
    if (pacer != nullptr && pacer->prepare) pacer->prepare(sent + offer);
    const ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    const int err = errno;
    if (gate != nullptr) gate->Exit();
    iov[n_iov - 1].iov_len = last_len;
    if (n < 0) {
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        if (absl::Status s = WaitFd(fd, POLLOUT, options, what); !s.ok()) {
          return s;
        }
        continue;
      }
      return ErrnoStatus(err, absl::StrCat("sendmsg while ", what));
    }
    sent += static_cast<uint64_t>(n);
    Consume(&iov, &count, static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> TcpConnect(absl::string_view endpoint,
                                    absl::Duration timeout, int buffer_bytes) {
  const size_t colon = endpoint.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos ||
      !absl::SimpleAtoi(endpoint.substr(colon + 1), &port) || port <= 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV endpoint '", endpoint,
                     "' must be host:port with port in [1, 65535]"));
  }
  auto addr = Resolve(endpoint.substr(0, colon), port);
  if (!addr.ok()) return addr.status();
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return ErrnoStatus(errno, "socket");
  if (absl::Status s = SetNonBlocking(fd.get()); !s.ok()) return s;
  const int one = 1;
  setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  SetBuffers(fd.get(), buffer_bytes);
  const std::string what = absl::StrCat("connecting to ", endpoint);
  if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&*addr),
              sizeof(*addr)) != 0) {
    if (errno != EINPROGRESS) return ErrnoStatus(errno, what);
    SocketIoOptions io;
    io.stall_timeout = timeout;
    if (absl::Status s = WaitFd(fd.get(), POLLOUT, io, what); !s.ok()) {
      return s;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return ErrnoStatus(err, what);
  }
  return fd;
}

absl::StatusOr<UniqueFd> TcpListen(absl::string_view host, int port,
                                   int* bound_port, int buffer_bytes) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV listen port ", port, " must be in [0, 65535]"));
  }
  auto addr = Resolve(host, port);
  if (!addr.ok()) return addr.status();
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return ErrnoStatus(errno, "socket");
  const int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  SetBuffers(fd.get(), buffer_bytes);
  const std::string what = absl::StrCat("binding ", host, ":", port);
  if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&*addr),
           sizeof(*addr)) != 0) {
    return ErrnoStatus(errno, what);
  }
  if (listen(fd.get(), 128) != 0) return ErrnoStatus(errno, what);
  if (absl::Status s = SetNonBlocking(fd.get()); !s.ok()) return s;
  sockaddr_in bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len);
  if (bound_port != nullptr) *bound_port = ntohs(bound.sin_port);
  return fd;
}

}  // namespace baton
