// baton-sim's state of one simulated worker, request and event
// (simulator.cc).
#ifndef BATON_BENCH_SIM_SIM_STATE_H_
#define BATON_BENCH_SIM_SIM_STATE_H_

#include <cstdint>
#include <deque>
#include <vector>

#include "bench/sim/simulator.h"
#include "bench/sim/step_queue.h"
#include "coordinator/routing_policy.h"
#include "worker/engine/prefill_rate.h"
#include "worker/kv_cache/prefix_hash.h"

namespace baton::sim {

struct Worker {
  explicit Worker(const WorkerProfile& p)
      : queue(p.max_num_seqs, p.max_batch_tokens) {}
  coordinator::WorkerRole role = coordinator::WorkerRole::kBoth;
  // Prompts to prefill and sequences running, as the engine orders them.
  StepQueue queue;
  std::deque<int> line;  // waiting for a KV reservation here (decode)
  std::vector<StepQueue::Item> in_step;  // what the current step computes
  int64_t free_blocks = 0;
  int64_t queued_prefill_tokens = 0;
  // Requests decoding here, as the coordinator counts them
  // (RequestLoad::sequences): from the reservation, or colocated from the
  // send, to the end.
  int64_t sequences = 0;
  bool busy = false;
  double step_start = 0;
  PrefillRate rate;
  coordinator::Candidates* pool = nullptr;  // where its WorkerInfo lives
  size_t pool_index = 0;
};

struct Request {
  SimRequest in;
  int prefill = -1;
  int decode = -1;  // the worker holding its KV blocks (colocated: prefill)
  int64_t blocks = 0;
  int64_t generated = 0;
  double prefill_start = 0;  // of the step that ends its prompt
  double last_token = 0;
  std::vector<BlockHash> chain;  // full prompt blocks, while in flight
  int64_t transfer_tokens = 0;   // those its decode worker lacks
  // Gaps between tokens, ms: kept in floats while the caches fill memory,
  // moved into the record's doubles once they are gone.
  std::vector<float> itl_ms;
};

enum class EventType { kArrival, kStepDone, kKvLanded };

struct Event {
  double t;
  int64_t seq;
  EventType type;
  int index;            // request (arrival, KV landed) or worker (step done)
  int64_t version = 0;  // step done: SharedHosts' version of the step
  bool operator>(const Event& o) const {
    return t != o.t ? t > o.t : seq > o.seq;
  }
};

}  // namespace baton::sim

#endif  // BATON_BENCH_SIM_SIM_STATE_H_
