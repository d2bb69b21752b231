// The TLS side of socket_io.h: the same reads and writes over a KvStream
// whose `tls` is set (kv_tls.h makes the sessions).
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/transport/socket_io.h"
#include "worker/transport/socket_io_internal.h"

namespace baton {

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

namespace socket_io_internal {
namespace {

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

}  // namespace

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

}  // namespace socket_io_internal
}  // namespace baton
