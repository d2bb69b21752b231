#include "coordinator/lease_ledger.h"

#include "common/check.h"

namespace baton::coordinator {

void LeaseLedger::Acquire(const WorkerRef& worker,
                          absl::string_view request_id) {
  auto [it, inserted] = live_.emplace(
      std::make_pair(worker.id, std::string(request_id)), worker.epoch);
  BATON_CHECK(inserted) << "lease of request " << request_id << " on " << worker
                        << " acquired twice (held by epoch " << it->second
                        << ")";
  ++acquired_;
}

void LeaseLedger::Release(const WorkerRef& worker, absl::string_view request_id,
                          LeaseRelease how) {
  auto it = live_.find(std::make_pair(worker.id, std::string(request_id)));
  BATON_CHECK(it != live_.end() && it->second == worker.epoch)
      << "lease of request " << request_id << " on " << worker
      << " released but not live";
  live_.erase(it);
  ++released_[static_cast<int>(how)];
}

bool LeaseLedger::Holds(const WorkerRef& worker,
                        absl::string_view request_id) const {
  auto it = live_.find(std::make_pair(worker.id, std::string(request_id)));
  return it != live_.end() && it->second == worker.epoch;
}

std::vector<Lease> LeaseLedger::Live() const {
  std::vector<Lease> out;
  out.reserve(live_.size());
  for (const auto& [key, epoch] : live_) {
    out.push_back(Lease{WorkerRef{key.first, epoch}, key.second});
  }
  return out;
}

std::vector<Lease> LeaseLedger::LiveOn(absl::string_view worker_id) const {
  std::vector<Lease> out;
  for (auto it = live_.lower_bound(
           std::make_pair(std::string(worker_id), std::string()));
       it != live_.end() && it->first.first == worker_id; ++it) {
    out.push_back(
        Lease{WorkerRef{it->first.first, it->second}, it->first.second});
  }
  return out;
}

int64_t LeaseLedger::released() const {
  int64_t total = 0;
  for (int64_t n : released_) total += n;
  return total;
}

}  // namespace baton::coordinator
