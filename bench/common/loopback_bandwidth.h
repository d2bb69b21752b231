// The machine's loopback TCP bandwidth: the ceiling a host KV transfer on
// 127.0.0.1 is compared against. One connected socket pair on 127.0.0.1, a
// sender thread writing fixed-size messages from one resident buffer and a
// receiver thread reading each message whole into another, so the figure
// holds only the kernel's two copies (user -> socket, socket -> user) and
// the TCP stack, nothing of Baton.
#ifndef BATON_BENCH_COMMON_LOOPBACK_BANDWIDTH_H_
#define BATON_BENCH_COMMON_LOOPBACK_BANDWIDTH_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace baton::bench {

struct LoopbackOptions {
  // Bytes per send() call on the sender / per whole-message read on the
  // receiver, >= 1 (use the per-layer payload size to mirror a KV transfer).
  uint64_t message_bytes = uint64_t{1} << 20;
  // Bytes moved per measurement, rounded up to whole messages, >= 1.
  uint64_t total_bytes = uint64_t{1} << 30;
  // SO_SNDBUF / SO_RCVBUF requested on both ends before connecting; 0 keeps
  // the kernel's autotuning (what the host KV transport uses). The kernel
  // caps a request at net.core.{w,r}mem_max.
  int socket_buffer_bytes = 0;
  // Size of the sender's source and the receiver's destination region: the
  // sender sends message after message from consecutive offsets of its
  // region and the receiver reads each into the next offset of its own,
  // wrapping around (rounded up to whole messages). 0 = one message: both
  // ends reuse one cache-resident buffer, as iperf-style tools do. Set it to
  // a KV cache's size to move the same bytes between regions of the same
  // footprint as the transfer does (memory traffic included).
  uint64_t region_bytes = 0;
  // Bytes per recv() call on the receiver, which loops until the message is
  // whole; 0 = one recv(MSG_WAITALL) per message.
  uint64_t recv_call_bytes = 0;
  // CPU the receiving thread runs on (pthread affinity); -1 = any. The
  // sending thread is the caller's, pinned (or not) by the caller.
  int receiver_cpu = -1;
};

// Pins the calling thread to `cpu` (no-op for cpu < 0); false on failure.
bool PinCurrentThread(int cpu);

struct LoopbackResult {
  uint64_t bytes = 0;   // bytes moved (whole messages)
  double seconds = 0;   // first send until the receiver acknowledged the last
  double gb_per_s = 0;  // bytes / seconds / 1e9
};

// Moves options.total_bytes through a fresh loopback connection and times
// it from the first send until the sender reads the receiver's one-byte
// acknowledgement of the last message. InvalidArgument for a zero size;
// Internal naming the call if a socket operation fails.
absl::StatusOr<LoopbackResult> MeasureLoopbackTcp(
    const LoopbackOptions& options);

}  // namespace baton::bench

#endif  // BATON_BENCH_COMMON_LOOPBACK_BANDWIDTH_H_
