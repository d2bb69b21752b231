#include "worker/transport/tcp_kv_connection_pool.h"

#include <poll.h>

#include <utility>

#include "common/status_macros.h"

namespace baton {
namespace {

// True if nothing happened on the idle socket: no data, no EOF, no error.
// An idle KV connection never receives anything between transfers, so any
// event means the receiver closed it (or broke the protocol).
bool StillIdle(int fd) {
  pollfd pfd{fd, POLLIN | POLLRDHUP, 0};
  return poll(&pfd, 1, 0) == 0;
}

}  // namespace

absl::StatusOr<KvConnection> TcpKvConnectionPool::Acquire(
    absl::string_view endpoint, absl::Duration timeout, int buffer_bytes,
    bool* reused) {
  if (reused != nullptr) *reused = false;
  std::vector<KvConnection> stale;  // closed outside the lock
  {
    absl::MutexLock lock(&mu_);
    auto it = idle_.find(endpoint);
    if (it != idle_.end()) {
      const absl::Time now = absl::Now();
      std::vector<Idle>& list = it->second;
      while (!list.empty()) {
        Idle last = std::move(list.back());
        list.pop_back();
        if (now - last.since <= options_.max_idle &&
            StillIdle(last.connection.fd.get())) {
          if (reused != nullptr) *reused = true;
          return std::move(last.connection);
        }
        stale.push_back(std::move(last.connection));
      }
    }
  }
  KvConnection fresh;
  BATON_ASSIGN_OR_RETURN(fresh.fd, TcpConnect(endpoint, timeout, buffer_bytes));
  return fresh;
}

void TcpKvConnectionPool::Release(absl::string_view endpoint,
                                  KvConnection connection) {
  if (connection.fd.get() < 0 || options_.max_idle_per_endpoint == 0) return;
  KvConnection dropped;  // closed outside the lock
  absl::MutexLock lock(&mu_);
  auto it = idle_.find(endpoint);
  if (it == idle_.end()) {
    it = idle_.emplace(std::string(endpoint), std::vector<Idle>()).first;
  }
  std::vector<Idle>& list = it->second;
  if (list.size() >= options_.max_idle_per_endpoint) {
    dropped = std::move(list.front().connection);  // the oldest
    list.erase(list.begin());
  }
  list.push_back({std::move(connection), absl::Now()});
}

size_t TcpKvConnectionPool::idle_count() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [endpoint, list] : idle_) n += list.size();
  return n;
}

}  // namespace baton
