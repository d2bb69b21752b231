// Idle TCP connections of KV senders, kept per receiver endpoint so that a
// prefill worker's next transfer to the same decode worker skips the connect
// and starts with the socket buffers TCP autotuning already grew (a fresh
// loopback connection begins with a 128 KiB receive window).
//
// A connection is returned only after a transfer that ended with the
// receiver's OK verdict, i.e. at a frame boundary with nothing unread; any
// error or abort closes it instead. Acquire hands out an idle connection only
// if it is younger than max_idle and the peer has not closed or written to
// it since (a readable or hung-up socket is dropped), else connects anew.
// The receiver keeps an idle connection open for TcpKvReceiverOptions::
// idle_timeout, which must exceed max_idle so that a connection is never
// handed out just as the receiver closes it.
//
// Thread-safe.
#ifndef BATON_WORKER_TRANSPORT_TCP_KV_CONNECTION_POOL_H_
#define BATON_WORKER_TRANSPORT_TCP_KV_CONNECTION_POOL_H_

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/transport/socket_io.h"

namespace baton {

struct TcpKvConnectionPoolOptions {
  // Idle connections kept per endpoint; more are closed on Release.
  size_t max_idle_per_endpoint = 4;
  // An idle connection older than this is closed instead of reused.
  absl::Duration max_idle = absl::Seconds(20);
};

class TcpKvConnectionPool {
 public:
  explicit TcpKvConnectionPool(const TcpKvConnectionPoolOptions& options = {})
      : options_(options) {}
  TcpKvConnectionPool(const TcpKvConnectionPool&) = delete;
  TcpKvConnectionPool& operator=(const TcpKvConnectionPool&) = delete;

  // The most recently released live connection to `endpoint` (with its TLS
  // session, if it had one), or a new one (TcpConnect with timeout and
  // buffer_bytes, and its errors; no TLS session yet). *reused (if given)
  // tells which.
  absl::StatusOr<KvConnection> Acquire(absl::string_view endpoint,
                                       absl::Duration timeout, int buffer_bytes,
                                       bool* reused = nullptr);

  // Keeps `connection` (to `endpoint`, idle at a frame boundary) for a
  // later Acquire.
  void Release(absl::string_view endpoint, KvConnection connection);

  // Idle connections held, all endpoints.
  size_t idle_count() const;

 private:
  struct Idle {
    KvConnection connection;
    absl::Time since;
  };
  const TcpKvConnectionPoolOptions options_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::vector<Idle>, std::less<>> idle_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_WORKER_TRANSPORT_TCP_KV_CONNECTION_POOL_H_
