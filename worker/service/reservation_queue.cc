#include "worker/service/reservation_queue.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace baton {
namespace {

absl::Status CallerGone(const std::string& request_id) {
  return absl::CancelledError(
      absl::StrCat("ReserveKv of '", request_id, "': the caller went away"));
}

}  // namespace

ReservationQueue::ReservationQueue(size_t capacity, absl::Duration poll)
    : capacity_(capacity), poll_(poll), thread_([this] { Run(); }) {}

ReservationQueue::~ReservationQueue() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
  std::deque<std::shared_ptr<Entry>> left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(line_);
  }
  for (const std::shared_ptr<Entry>& entry : left) {
    entry->finish(absl::UnavailableError(absl::StrCat(
        "ReserveKv of '", entry->request_id,
        "': the worker is shutting down while it waited for KV room")));
  }
}

absl::Status ReservationQueue::Add(Entry entry) {
  absl::MutexLock lock(&mu_);
  if (line_.size() >= capacity_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("ReserveKv of '", entry.request_id, "': no KV room, and ",
                     line_.size(), " reservations wait here already (limit ",
                     capacity_, ", --max_queued_reservations)"));
  }
  auto it = line_.end();
  while (it != line_.begin() && (*std::prev(it))->arrival_us > entry.arrival_us)
    --it;
  line_.insert(it, std::make_shared<Entry>(std::move(entry)));
  return absl::OkStatus();
}

size_t ReservationQueue::size() const {
  absl::MutexLock lock(&mu_);
  return line_.size();
}

bool ReservationQueue::ServeHead() {
  std::shared_ptr<Entry> head;
  {
    absl::MutexLock lock(&mu_);
    if (line_.empty()) return false;
    head = line_.front();
  }
  absl::Status status;
  if (head->cancelled()) {
    status = CallerGone(head->request_id);
  } else {
    status = head->reserve();
    if (absl::IsResourceExhausted(status)) {
      if (absl::Now() < head->until) return false;
      status = absl::ResourceExhaustedError(
          absl::StrCat(status.message(),
                       "; waited for room here until the "
                       "request's queue_ms ran out"));
    }
  }
  {
    // An entry that came since may stand ahead of it now.
    absl::MutexLock lock(&mu_);
    line_.erase(std::find(line_.begin(), line_.end(), head));
  }
  head->finish(std::move(status));
  return true;
}

void ReservationQueue::Sweep() {
  std::vector<std::pair<std::shared_ptr<Entry>, absl::Status>> done;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    for (auto it = line_.size() > 1 ? line_.begin() + 1 : line_.end();
         it != line_.end();) {
      const Entry& e = **it;
      if (e.cancelled()) {
        done.emplace_back(*it, CallerGone(e.request_id));
      } else if (now >= e.until) {
        done.emplace_back(*it, absl::ResourceExhaustedError(absl::StrCat(
                                   "ReserveKv of '", e.request_id,
                                   "': no KV room here before its queue_ms "
                                   "ran out (",
                                   line_.size(), " waited)")));
      } else {
        ++it;
        continue;
      }
      it = line_.erase(it);
    }
  }
  for (auto& [entry, status] : done) entry->finish(std::move(status));
}

bool ReservationQueue::HasWorkOrStop() const { return stop_ || !line_.empty(); }

void ReservationQueue::Run() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &ReservationQueue::HasWorkOrStop));
      if (stop_) return;
    }
    Sweep();
    while (ServeHead()) {
    }
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stop_), poll_);
    if (stop_) return;
  }
}

}  // namespace baton
