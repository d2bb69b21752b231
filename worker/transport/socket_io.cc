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
#include "common/status_macros.h"

namespace baton {
namespace {

absl::Status ErrnoStatus(int err, absl::string_view what) {
  const std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  if (err == EPIPE || err == ECONNRESET || err == ECONNREFUSED ||
      err == ENOTCONN || err == ECONNABORTED || err == EHOSTUNREACH ||
      err == ENETUNREACH) {
    return absl::UnavailableError(msg);
  }
  return absl::InternalError(msg);
}

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

// recvmsg reads at most this much per call, so on_data sees bytes while they
// are still in the L2 cache the kernel copied them through.
constexpr size_t kRecvSliceBytes = size_t{256} << 10;

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

// One SSL_read_ex / SSL_write_ex of up to n bytes. Returns the bytes moved;
// 0 when the call is to be repeated (it waited until the socket is ready),
// or with *eof set when the peer closed the connection (reading).
absl::StatusOr<size_t> TlsStep(KvStream stream, bool write, void* data,
                               size_t n, const SocketIoOptions& options,
                               absl::string_view what, bool* eof) {
  ERR_clear_error();
  errno = 0;
  size_t done = 0;
  const int ok = write ? SSL_write_ex(stream.tls, data, n, &done)
                       : SSL_read_ex(stream.tls, data, n, &done);
  if (ok == 1) return done;
  const int err = SSL_get_error(stream.tls, ok);
  const int sys = errno;
  switch (err) {
    case SSL_ERROR_WANT_READ:
      BATON_RETURN_IF_ERROR(WaitFd(stream.fd, POLLIN, options, what));
      return 0;
    case SSL_ERROR_WANT_WRITE:
      BATON_RETURN_IF_ERROR(WaitFd(stream.fd, POLLOUT, options, what));
      return 0;
    case SSL_ERROR_ZERO_RETURN:
      if (eof != nullptr) *eof = true;
      return 0;
    case SSL_ERROR_SYSCALL:
      if (sys == EINTR) return 0;
      if (ERR_peek_error() == 0) {
        if (sys == 0 && eof != nullptr) {
          *eof = true;
          return 0;
        }
        return ErrnoStatus(
            sys == 0 ? EPIPE : sys,
            absl::StrCat("TLS ", write ? "write" : "read", " while ", what));
      }
      break;
    default:
      break;
  }
  // The peer refused the session (an alert: e.g. it did not accept this
  // side's certificate, which TLS 1.3 tells a client only after its
  // handshake returned).
  const unsigned long first = ERR_peek_error();
  if (ERR_GET_LIB(first) == ERR_LIB_SSL &&
      ERR_GET_REASON(first) >= SSL_AD_REASON_OFFSET) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the peer ended the TLS session while ", what, ": ", TakeTlsErrors()));
  }
  // A record that fails its integrity check, or any other TLS error: the
  // stream cannot go on.
  return absl::DataLossError(absl::StrCat("TLS ", write ? "write" : "read",
                                          " failed while ", what, ": ",
                                          TakeTlsErrors()));
}

absl::Status TlsRecvExact(KvStream stream, std::span<uint8_t> out,
                          const SocketIoOptions& options,
                          absl::string_view what, bool* clean_eof) {
  size_t got = 0;
  while (got < out.size()) {
    bool eof = false;
    BATON_ASSIGN_OR_RETURN(const size_t n,
                           TlsStep(stream, false, out.data() + got,
                                   out.size() - got, options, what, &eof));
    if (eof) {
      if (got == 0 && clean_eof != nullptr) {
        *clean_eof = true;
        return absl::OkStatus();
      }
      return absl::UnavailableError(
          absl::StrCat("peer closed the connection after ", got, " of ",
                       out.size(), " bytes while ", what));
    }
    got += n;
  }
  return absl::OkStatus();
}

absl::Status TlsRecvAllV(
    KvStream stream, iovec* iov, int count, const SocketIoOptions& options,
    absl::string_view what,
    const std::function<void(std::span<const uint8_t>)>& on_data) {
  size_t total = 0;
  for (int i = 0; i < count; ++i) total += iov[i].iov_len;
  size_t got = 0;
  for (int i = 0; i < count; ++i) {
    auto* p = static_cast<uint8_t*>(iov[i].iov_base);
    size_t left = iov[i].iov_len;
    while (left > 0) {
      bool eof = false;
      BATON_ASSIGN_OR_RETURN(
          const size_t n,
          TlsStep(stream, false, p, std::min(left, kRecvSliceBytes), options,
                  what, &eof));
      if (eof) {
        return absl::UnavailableError(
            absl::StrCat("peer closed the connection after ", got, " of ",
                         total, " bytes while ", what));
      }
      if (n == 0) continue;
      if (on_data) on_data(std::span<const uint8_t>(p, n));
      p += n;
      left -= n;
      got += n;
    }
  }
  return absl::OkStatus();
}

// iovecs shorter than this are gathered into one TLS record (a frame header,
// its ids, small chunks) rather than each sent as a record of its own.
constexpr size_t kTlsGatherBelow = size_t{16} << 10;

absl::Status TlsSendAllV(KvStream stream, iovec* iov, int count,
                         const SocketIoOptions& options, absl::string_view what,
                         ReadGate* gate, const SendPacer* pacer) {
  const size_t max_call = pacer != nullptr && pacer->max_call_bytes > 0
                              ? pacer->max_call_bytes
                              : SIZE_MAX;
  std::vector<uint8_t> gathered;
  uint64_t sent = 0;
  int i = 0;
  size_t off = 0;  // bytes of iov[i] already sent
  while (i < count) {
    if (off == iov[i].iov_len) {
      ++i;
      off = 0;
      continue;
    }
    // This call's bytes: a run of short iovecs, gathered, or a piece of
    // one long iovec, sent in place.
    int run_end = i;
    size_t run_bytes = 0;
    while (run_end < count &&
           iov[run_end].iov_len - (run_end == i ? off : 0) < kTlsGatherBelow &&
           run_bytes < kTlsGatherBelow * 4) {
      run_bytes += iov[run_end].iov_len - (run_end == i ? off : 0);
      ++run_end;
    }
    const bool gather = run_end > i + 1;
    const size_t len =
        gather ? run_bytes : std::min(iov[i].iov_len - off, max_call);
    const uint8_t* data = static_cast<const uint8_t*>(iov[i].iov_base) + off;
    bool prepared = false;
    while (true) {
      if (gate != nullptr && !gate->Enter()) {
        return absl::CancelledError(
            absl::StrCat("source memory released while ", what));
      }
      if (!prepared) {
        // Every byte of the call is final (and, gathered, copied) before
        // the first attempt; a retry resends the same bytes.
        if (pacer != nullptr && pacer->prepare) pacer->prepare(sent + len);
        if (gather) {
          gathered.clear();
          for (int j = i; j < run_end; ++j) {
            const size_t skip = j == i ? off : 0;
            const auto* b = static_cast<const uint8_t*>(iov[j].iov_base);
            gathered.insert(gathered.end(), b + skip, b + iov[j].iov_len);
          }
          data = gathered.data();
        }
        prepared = true;
      }
      absl::StatusOr<size_t> n =
          TlsStep(stream, true, const_cast<uint8_t*>(data), len, options, what,
                  nullptr);
      if (gate != nullptr) gate->Exit();
      BATON_RETURN_IF_ERROR(n.status());
      if (*n == 0) continue;  // waited: the same bytes again
      // Without partial writes a call writes all of it or nothing.
      if (*n != len) {
        return absl::InternalError(
            absl::StrCat("TLS wrote ", *n, " of ", len, " bytes while ", what));
      }
      break;
    }
    sent += len;
    if (gather) {
      i = run_end;
      off = 0;
    } else {
      off += len;
    }
  }
  return absl::OkStatus();
}

}  // namespace

void SslFree::operator()(ssl_st* ssl) const { SSL_free(ssl); }

std::string TakeTlsErrors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    absl::StrAppend(&out, out.empty() ? "" : "; ", buf);
  }
  return out;
}

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
