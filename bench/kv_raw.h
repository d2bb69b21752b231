// kv_transfer_bench, parts 1-2: loopback TCP bandwidth, and a raw KV
// transfer (a KvCache of N tokens sent layer by layer from its pool chunks,
// hashed as they go out, to a TcpKvReceiver that receives straight into
// reserved blocks of a second pool) timed stage by stage on both sides.
#ifndef BATON_BENCH_KV_RAW_H_
#define BATON_BENCH_KV_RAW_H_

#include <cstdint>
#include <string>
#include <vector>

#include "bench/kv_bench_util.h"
#include "nlohmann/json.hpp"

namespace baton::kvbench {

// One transport configuration under test.
struct RawVariant {
  std::string name;
  size_t send_call_bytes = size_t{2} << 20;  // TcpKvSenderOptions
  int socket_buffer_bytes = 0;               // both ends; 0 = autotuned
  // Senders take their connection from a TcpKvConnectionPool (warmed by the
  // warm-up transfer), as workers do; otherwise each transfer connects.
  bool pooled = false;
  // Both ends speak TLS (baton-worker --kv_tls), with a CA and certificates
  // made at start in a temporary directory.
  bool tls = false;
};

struct RawOptions {
  int repeats = 5;                       // medians over these
  uint64_t loopback_bytes = 1ull << 30;  // per loopback measurement
  int loopback_fixed_buffer = 4 << 20;   // SO_SNDBUF/RCVBUF of the 2nd one
  // Measured alternately within each repeat; the first also runs "send
  // only" (payloads exported and checksummed beforehand).
  std::vector<RawVariant> variants = {RawVariant{"default"}};
  // Sending threads run on sender_cpu, receiving threads on receiver_cpu
  // (loopback ceilings and transfers alike); -1 = wherever the scheduler
  // puts them.
  int sender_cpu = -1;
  int receiver_cpu = -1;
};

// Measures the 64 MiB-message loopback ceiling, then every shape x token
// count; prints a table and appends every figure to out["raw"]. Exits on
// any error (including a destination that differs from the source).
void RunRaw(const std::vector<Shape>& shapes,
            const std::vector<int64_t>& token_counts, const RawOptions& options,
            nlohmann::json& out);

}  // namespace baton::kvbench

#endif  // BATON_BENCH_KV_RAW_H_
