#include "bench/common/loopback_bandwidth.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace baton::bench {
namespace {

// Closes the descriptor on scope exit.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

absl::Status Errno(absl::string_view what) {
  return absl::InternalError(
      absl::StrCat("loopback bandwidth: ", what, ": ", std::strerror(errno)));
}

void Configure(int fd, int buffer_bytes) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes));
  }
}

bool SendAll(int fd, const uint8_t* p, uint64_t n) {
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<uint64_t>(w);
  }
  return true;
}

// call_bytes 0: one recv(MSG_WAITALL) for all n bytes (repeated only if it
// returns early); otherwise recv() calls of at most call_bytes.
bool RecvAll(int fd, uint8_t* p, uint64_t n, uint64_t call_bytes = 0) {
  while (n > 0) {
    const ssize_t r = call_bytes == 0 ? recv(fd, p, n, MSG_WAITALL)
                                      : recv(fd, p, std::min(n, call_bytes), 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<uint64_t>(r);
  }
  return true;
}

}  // namespace

bool PinCurrentThread(int cpu) {
  if (cpu < 0) return true;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

absl::StatusOr<LoopbackResult> MeasureLoopbackTcp(
    const LoopbackOptions& options) {
  if (options.message_bytes == 0 || options.total_bytes == 0) {
    return absl::InvalidArgumentError(
        "loopback bandwidth: message_bytes and total_bytes must be >= 1");
  }
  const uint64_t messages =
      (options.total_bytes + options.message_bytes - 1) / options.message_bytes;

  Fd listener(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (listener.get() < 0) return Errno("socket");
  // Set on the listener so the accepted socket inherits it before the
  // handshake fixes the window scale.
  Configure(listener.get(), options.socket_buffer_bytes);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(listener.get(), reinterpret_cast<const sockaddr*>(&addr),
           sizeof(addr)) != 0) {
    return Errno("bind 127.0.0.1:0");
  }
  if (listen(listener.get(), 1) != 0) return Errno("listen");
  socklen_t len = sizeof(addr);
  getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len);

  Fd sender(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (sender.get() < 0) return Errno("socket");
  Configure(sender.get(), options.socket_buffer_bytes);
  if (connect(sender.get(), reinterpret_cast<const sockaddr*>(&addr),
              sizeof(addr)) != 0) {
    return Errno("connect");
  }
  Fd receiver(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (receiver.get() < 0) return Errno("accept");
  Configure(receiver.get(), options.socket_buffer_bytes);

  // Both regions touched before the clock starts (no page faults timed).
  const uint64_t slots =
      std::max<uint64_t>(1, (options.region_bytes + options.message_bytes - 1) /
                                options.message_bytes);
  std::vector<uint8_t> out(slots * options.message_bytes, 0x5A);
  std::vector<uint8_t> in(slots * options.message_bytes, 0);
  const uint64_t message_bytes = options.message_bytes;
  auto at = [&](std::vector<uint8_t>& v, uint64_t m) {
    return v.data() + (m % slots) * message_bytes;
  };

  bool receiver_ok = true;
  std::thread reader([&] {
    PinCurrentThread(options.receiver_cpu);
    for (uint64_t m = 0; m < messages && receiver_ok; ++m) {
      receiver_ok = RecvAll(receiver.get(), at(in, m), message_bytes,
                            options.recv_call_bytes);
    }
    const uint8_t ack = 1;
    if (receiver_ok) receiver_ok = SendAll(receiver.get(), &ack, 1);
  });
  const auto start = std::chrono::steady_clock::now();
  bool sender_ok = true;
  for (uint64_t m = 0; m < messages && sender_ok; ++m) {
    sender_ok = SendAll(sender.get(), at(out, m), message_bytes);
  }
  uint8_t ack = 0;
  if (sender_ok) sender_ok = RecvAll(sender.get(), &ack, 1);
  const auto end = std::chrono::steady_clock::now();
  if (!sender_ok) shutdown(sender.get(), SHUT_RDWR);  // unblocks the reader
  reader.join();
  if (!sender_ok || !receiver_ok) {
    return absl::InternalError(
        absl::StrCat("loopback bandwidth: transfer of ", messages,
                     " messages of ", options.message_bytes, " bytes failed (",
                     sender_ok ? "receiver" : "sender", " side)"));
  }
  LoopbackResult result;
  result.bytes = messages * options.message_bytes;
  result.seconds = std::chrono::duration<double>(end - start).count();
  result.gb_per_s = static_cast<double>(result.bytes) / result.seconds / 1e9;
  return result;
}

}  // namespace baton::bench
