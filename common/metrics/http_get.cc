#include "common/metrics/http_get.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace baton::metrics {
namespace {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Waits until `fd` is ready for `events` or `deadline` passes.
absl::Status WaitReady(int fd, short events, absl::Time deadline) {
  while (true) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) return absl::DeadlineExceededError("HTTP GET timed out");
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, static_cast<int>(ms));
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) {
      return absl::UnavailableError(
          absl::StrCat("poll: ", std::strerror(errno)));
    }
  }
}

}  // namespace

absl::StatusOr<std::string> HttpGet(absl::string_view address,
                                    absl::string_view path,
                                    absl::Duration timeout) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port <= 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", address, "' is not host:port"));
  }
  std::string host(address.substr(0, colon));
  if (host == "localhost") host = "127.0.0.1";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("host '", host, "' is not an IPv4 address"));
  }
  const absl::Time deadline = absl::Now() + timeout;
  Fd fd(socket(AF_INET, SOCK_STREAM, 0));
  if (fd.get() < 0) {
    return absl::UnavailableError(
        absl::StrCat("socket: ", std::strerror(errno)));
  }
  if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr),
              sizeof(addr)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("connect to ", address, ": ", std::strerror(errno)));
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", address, "\r\n\r\n");
  size_t sent = 0;
  while (sent < request.size()) {
    if (absl::Status s = WaitReady(fd.get(), POLLOUT, deadline); !s.ok()) {
      return s;
    }
    const ssize_t n = send(fd.get(), request.data() + sent,
                           request.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(
          absl::StrCat("send: ", std::strerror(errno)));
    }
    sent += static_cast<size_t>(n);
  }
  std::string reply;
  char buffer[16384];
  while (true) {
    if (absl::Status s = WaitReady(fd.get(), POLLIN, deadline); !s.ok()) {
      return s;
    }
    const ssize_t n = recv(fd.get(), buffer, sizeof(buffer), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(
          absl::StrCat("recv: ", std::strerror(errno)));
    }
    if (n == 0) break;
    reply.append(buffer, static_cast<size_t>(n));
  }
  const size_t line_end = reply.find("\r\n");
  const std::string status_line = reply.substr(0, line_end);
  if (!absl::StartsWith(status_line, "HTTP/1.") || status_line.size() < 12 ||
      status_line.substr(9, 3) != "200") {
    return absl::InternalError(
        absl::StrCat("GET ", path, " from ", address, ": '", status_line, "'"));
  }
  const size_t body = reply.find("\r\n\r\n");
  if (body == std::string::npos) {
    return absl::InternalError(absl::StrCat("GET ", path, " from ", address,
                                            ": reply without a header end"));
  }
  return reply.substr(body + 4);
}

}  // namespace baton::metrics
