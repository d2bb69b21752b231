// KV reservations that found no room on this worker, waiting for it in the
// order their requests reached the cluster (ReserveKvRequest.queue_ms and
// arrival_unix_micros).
//
// Every coordinator replica routes with its own bookkeeping: a replica sees
// the room its own finished request frees at once, another one only at the
// next heartbeat. Refusing a reservation that finds no room would let the
// first replica's next request take that room every time, and starve the
// other replica's (each retrying on its own schedule). Waiting here instead,
// in one line per worker, serves them in the order they came: by each
// request's arrival at its coordinator, since a call can reach the worker
// milliseconds after later ones (its coordinator thread descheduled), calls
// with equal keys in the order they reached the worker.
//
// One thread retries the head of the line every `poll` while the line is
// not empty (blocks free on many paths: a decode ending, a cancel, a
// transfer failing, a reservation expiring); no entry behind the head is
// tried before it. An entry leaves when its reservation succeeds or fails
// for another reason than room, when its caller has gone, or when its wait
// runs out (RESOURCE_EXHAUSTED naming the wait).
#ifndef BATON_WORKER_SERVICE_RESERVATION_QUEUE_H_
#define BATON_WORKER_SERVICE_RESERVATION_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace baton {

class ReservationQueue {
 public:
  struct Entry {
    std::string request_id;
    // Tries the reservation (no lock of the queue held); ResourceExhausted:
    // still no room.
    std::function<absl::Status()> reserve;
    // Called once, with the reservation's status, when the entry leaves.
    std::function<void(absl::Status)> finish;
    // True once the caller has gone (its RPC was cancelled).
    std::function<bool()> cancelled;
    absl::Time until;  // waits no longer than this
    // The line's order: behind entries with a key no later, ahead of those
    // with a later one (FcfsArrival of the request's stamp).
    int64_t arrival_us = 0;
  };

  // At most `capacity` entries wait (Add refuses more).
  explicit ReservationQueue(size_t capacity,
                            absl::Duration poll = absl::Milliseconds(5));
  // Finishes every entry still waiting with UNAVAILABLE.
  ~ReservationQueue();
  ReservationQueue(const ReservationQueue&) = delete;
  ReservationQueue& operator=(const ReservationQueue&) = delete;

  // Puts `entry` in line by its arrival_us; RESOURCE_EXHAUSTED (and `entry`
  // is not finished) when `capacity` entries wait already.
  absl::Status Add(Entry entry);
  size_t size() const;

 private:
  void Run();
  bool HasWorkOrStop() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Finishes and removes the head if it is done; false if it still waits.
  bool ServeHead();
  // Finishes and removes the entries behind the head whose caller went
  // away or whose wait ran out.
  void Sweep();

  const size_t capacity_;
  const absl::Duration poll_;
  mutable absl::Mutex mu_;
  // Entries are owned here; only the queue's thread removes them.
  std::deque<std::shared_ptr<Entry>> line_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace baton

#endif  // BATON_WORKER_SERVICE_RESERVATION_QUEUE_H_
