#include "coordinator/prefix_index.h"

namespace baton::coordinator {

void PrefixIndex::Apply(const WorkerId& worker, bool snapshot,
                        std::span<const BlockHash> stored,
                        std::span<const BlockHash> removed) {
  absl::MutexLock lock(&mu_);
  absl::flat_hash_set<BlockHash>& held = by_worker_[worker];
  if (snapshot) held.clear();
  // A delta names each hash once, by its last event (the worker folds
  // them), so the order of the two lists does not matter.
  for (const BlockHash& h : removed) held.erase(h);
  for (const BlockHash& h : stored) held.insert(h);
  if (held.empty()) by_worker_.erase(worker);
}

void PrefixIndex::Forget(const WorkerId& worker) {
  absl::MutexLock lock(&mu_);
  by_worker_.erase(worker);
}

int64_t PrefixIndex::MatchLength(const WorkerId& worker,
                                 std::span<const BlockHash> chain) const {
  absl::MutexLock lock(&mu_);
  auto it = by_worker_.find(worker);
  if (it == by_worker_.end()) return 0;
  int64_t n = 0;
  for (const BlockHash& h : chain) {
    if (!it->second.contains(h)) break;
    ++n;
  }
  return n;
}

int64_t PrefixIndex::NumBlocks(const WorkerId& worker) const {
  absl::MutexLock lock(&mu_);
  auto it = by_worker_.find(worker);
  return it == by_worker_.end() ? 0 : static_cast<int64_t>(it->second.size());
}

}  // namespace baton::coordinator
