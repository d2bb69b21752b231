#include "coordinator/prefix_index.h"

#include <algorithm>

namespace baton::coordinator {

PrefixIndex::Slot PrefixIndex::SlotLocked(const WorkerId& worker) {
  auto it = slots_.find(worker);
  if (it != slots_.end()) return it->second;
  Slot slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
    ids_[slot] = worker;
  } else {
    slot = static_cast<Slot>(ids_.size());
    ids_.push_back(worker);
    counts_.push_back(0);
  }
  slots_[worker] = slot;
  return slot;
}

void PrefixIndex::DropBlocksLocked(Slot slot) {
  if (counts_[slot] == 0) return;
  for (auto it = holders_.begin(); it != holders_.end();) {
    Holders& h = it->second;
    auto pos = std::lower_bound(h.begin(), h.end(), slot);
    if (pos != h.end() && *pos == slot) h.erase(pos);
    if (h.empty()) {
      holders_.erase(it++);
    } else {
      ++it;
    }
  }
  counts_[slot] = 0;
}

bool PrefixIndex::Apply(const WorkerId& worker, bool snapshot,
                        std::span<const BlockHash> stored,
                        std::span<const BlockHash> removed,
                        int64_t max_blocks) {
  absl::MutexLock lock(&mu_);
  const Slot slot = SlotLocked(worker);
  if (snapshot) DropBlocksLocked(slot);
  // Checked before anything is inserted: a removal never makes room for
  // more stored hashes than a pool holds.
  if (static_cast<int64_t>(stored.size()) > max_blocks) {
    DropBlocksLocked(slot);
    return false;
  }
  // A delta names each hash once, by its last event (the worker folds
  // them), so the order of the two lists does not matter.
  for (const BlockHash& hash : removed) {
    auto it = holders_.find(hash);
    if (it == holders_.end()) continue;
    Holders& h = it->second;
    auto pos = std::lower_bound(h.begin(), h.end(), slot);
    if (pos == h.end() || *pos != slot) continue;
    h.erase(pos);
    --counts_[slot];
    if (h.empty()) holders_.erase(it);
  }
  for (const BlockHash& hash : stored) {
    Holders& h = holders_[hash];
    auto pos = std::lower_bound(h.begin(), h.end(), slot);
    if (pos != h.end() && *pos == slot) continue;
    h.insert(pos, slot);
    ++counts_[slot];
  }
  if (counts_[slot] > max_blocks) {
    DropBlocksLocked(slot);
    return false;
  }
  return true;
}

void PrefixIndex::Forget(const WorkerId& worker) {
  absl::MutexLock lock(&mu_);
  auto it = slots_.find(worker);
  if (it == slots_.end()) return;
  const Slot slot = it->second;
  DropBlocksLocked(slot);
  slots_.erase(it);
  ids_[slot].clear();
  free_slots_.push_back(slot);
}

int64_t PrefixIndex::MatchLength(const WorkerId& worker,
                                 std::span<const BlockHash> chain) const {
  absl::MutexLock lock(&mu_);
  auto slot = slots_.find(worker);
  if (slot == slots_.end()) return 0;
  int64_t n = 0;
  for (const BlockHash& hash : chain) {
    auto it = holders_.find(hash);
    if (it == holders_.end() ||
        !std::binary_search(it->second.begin(), it->second.end(),
                            slot->second)) {
      break;
    }
    ++n;
  }
  return n;
}

absl::flat_hash_map<WorkerId, int64_t> PrefixIndex::MatchAll(
    std::span<const BlockHash> chain) const {
  absl::flat_hash_map<WorkerId, int64_t> out;
  absl::MutexLock lock(&mu_);
  Holders active, next;
  for (size_t i = 0; i < chain.size(); ++i) {
    auto it = holders_.find(chain[i]);
    next.clear();
    if (it != holders_.end()) {
      if (i == 0) {
        next = it->second;
      } else {
        std::set_intersection(active.begin(), active.end(), it->second.begin(),
                              it->second.end(), std::back_inserter(next));
      }
    }
    // The workers that stopped matching hold exactly i leading blocks.
    for (Slot s : active) {
      if (!std::binary_search(next.begin(), next.end(), s)) {
        out[ids_[s]] = static_cast<int64_t>(i);
      }
    }
    active.swap(next);
    if (active.empty()) return out;
  }
  for (Slot s : active) out[ids_[s]] = static_cast<int64_t>(chain.size());
  return out;
}

int64_t PrefixIndex::NumBlocks(const WorkerId& worker) const {
  absl::MutexLock lock(&mu_);
  auto it = slots_.find(worker);
  return it == slots_.end() ? 0 : counts_[it->second];
}

}  // namespace baton::coordinator
