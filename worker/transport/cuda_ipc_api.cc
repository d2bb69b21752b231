#include "worker/transport/cuda_ipc_api.h"

#include <algorithm>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace baton {

absl::Status WaitCudaIpcStream(CudaIpcApi& api, CudaIpcStreamHandle stream,
                               absl::Time deadline,
                               absl::Duration poll_interval,
                               absl::string_view what) {
  // A layer's copy takes tens of microseconds on one device: spin (yielding)
  // that long before sleeping between polls.
  const absl::Time spin_until = absl::Now() + absl::Microseconds(200);
  while (true) {
    absl::StatusOr<bool> done = api.StreamDone(stream);
    if (!done.ok()) return done.status();
    if (*done) return absl::OkStatus();
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": device copy not complete at the deadline"));
    }
    if (now < spin_until) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(std::min(poll_interval, deadline - now));
    }
  }
}

// What the cache and its mappings share. `open` holds every handle opened
// through the cache and not yet closed, evicted or not.
struct CudaIpcMapping::State {
  CudaIpcApi* api = nullptr;
  int device = 0;
  absl::Mutex mu;
  struct Entry {
    std::shared_ptr<const CudaIpcMapping> cached;  // null once evicted
    std::weak_ptr<const CudaIpcMapping> alive;
    std::string peer;
  };
  std::map<CudaIpcHandleBytes, Entry> entries ABSL_GUARDED_BY(mu);
  std::set<CudaIpcHandleBytes> open ABSL_GUARDED_BY(mu);
};

CudaIpcMapping::~CudaIpcMapping() {
  absl::MutexLock lock(&state_->mu);
  state_->api->CloseMemory(state_->device, base_);
  state_->open.erase(handle_);
  if (auto it = state_->entries.find(handle_);
      it != state_->entries.end() && it->second.cached == nullptr) {
    state_->entries.erase(it);
  }
}

absl::StatusOr<std::unique_ptr<CudaIpcPeerMappings>>
CudaIpcPeerMappings::Create(CudaIpcApi* api, int device) {
  if (api == nullptr || device < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaIpcPeerMappings needs an api and a device >= 0, got device ",
        device));
  }
  auto state = std::make_shared<CudaIpcMapping::State>();
  state->api = api;
  state->device = device;
  return std::unique_ptr<CudaIpcPeerMappings>(
      new CudaIpcPeerMappings(std::move(state)));
}

CudaIpcPeerMappings::~CudaIpcPeerMappings() {
  // Mappings close under state_->mu: drop them after unlocking.
  std::vector<std::shared_ptr<const CudaIpcMapping>> drop;
  {
    absl::MutexLock lock(&state_->mu);
    for (auto& [handle, entry] : state_->entries) {
      if (entry.cached != nullptr) drop.push_back(std::move(entry.cached));
    }
  }
}

CudaIpcApi& CudaIpcPeerMappings::api() const { return *state_->api; }
int CudaIpcPeerMappings::device() const { return state_->device; }

absl::StatusOr<std::shared_ptr<const CudaIpcMapping>> CudaIpcPeerMappings::Open(
    const CudaIpcHandleBytes& handle, absl::string_view peer) {
  using State = CudaIpcMapping::State;
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  while (true) {
    if (auto it = s.entries.find(handle); it != s.entries.end()) {
      State::Entry& entry = it->second;
      if (entry.cached != nullptr) return entry.cached;
      if (std::shared_ptr<const CudaIpcMapping> alive = entry.alive.lock()) {
        entry.cached = alive;
        entry.peer = std::string(peer);
        return alive;
      }
    }
    if (!s.open.contains(handle)) break;
    // An earlier mapping of the handle is being closed by its last user;
    // wait for that, or for another thread to have opened it anew.
    auto ready = [&s, &handle]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
      auto it = s.entries.find(handle);
      return !s.open.contains(handle) ||
             (it != s.entries.end() && it->second.cached != nullptr);
    };
    s.mu.Await(absl::Condition(&ready));
  }
  absl::StatusOr<void*> base = s.api->OpenMemory(s.device, handle);
  if (!base.ok()) return base.status();
  s.open.insert(handle);
  std::shared_ptr<const CudaIpcMapping> mapping(
      new CudaIpcMapping(state_, handle, *base));
  State::Entry& entry = s.entries[handle];
  entry.cached = mapping;
  entry.alive = mapping;
  entry.peer = std::string(peer);
  return mapping;
}

void CudaIpcPeerMappings::Evict(const CudaIpcHandleBytes& handle) {
  std::shared_ptr<const CudaIpcMapping> drop;
  absl::MutexLock lock(&state_->mu);
  auto it = state_->entries.find(handle);
  if (it == state_->entries.end()) return;
  drop = std::move(it->second.cached);
  if (it->second.alive.expired()) state_->entries.erase(it);
  // `drop` is released after the lock (declared before it).
}

void CudaIpcPeerMappings::EvictPeer(absl::string_view peer) {
  std::vector<std::shared_ptr<const CudaIpcMapping>> drop;
  absl::MutexLock lock(&state_->mu);
  for (auto it = state_->entries.begin(); it != state_->entries.end();) {
    if (it->second.peer != peer) {
      ++it;
      continue;
    }
    if (it->second.cached != nullptr) {
      drop.push_back(std::move(it->second.cached));
    }
    it = it->second.alive.expired() ? state_->entries.erase(it) : std::next(it);
  }
}

int CudaIpcPeerMappings::num_cached() const {
  absl::MutexLock lock(&state_->mu);
  int n = 0;
  for (const auto& [handle, entry] : state_->entries) {
    n += entry.cached != nullptr;
  }
  return n;
}

}  // namespace baton
