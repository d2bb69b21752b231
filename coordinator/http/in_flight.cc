#include "coordinator/http/in_flight.h"

#include <utility>
#include <vector>

namespace baton::http {

uint64_t InFlight::Add(std::function<void()> cancel) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  cancels_.emplace(id, std::move(cancel));
  return id;
}

void InFlight::Remove(uint64_t id) {
  std::function<void()> cancel;  // destroyed outside the lock
  absl::MutexLock lock(&mu_);
  auto it = cancels_.find(id);
  if (it == cancels_.end()) return;
  cancel = std::move(it->second);
  cancels_.erase(it);
}

void InFlight::CancelAll() {
  std::vector<std::function<void()>> cancels;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, cancel] : cancels_) cancels.push_back(cancel);
  }
  for (const auto& cancel : cancels) cancel();
}

bool InFlight::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(
      absl::Condition(
          +[](std::map<uint64_t, std::function<void()>>* m) {
            return m->empty();
          },
          &cancels_),
      timeout);
}

int64_t InFlight::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(cancels_.size());
}

}  // namespace baton::http
