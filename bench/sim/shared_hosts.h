// Steps of workers that share a host (baton-sim --workers_per_host): a
// step runs slower while others of its host compute, by the profile's
// neighbour slowdown, and for as long as they do. A step of P seconds of
// prefill and D of decode (alone) progresses at 1 / ((P + D)·(1 + x)) of
// itself per second, where x is p·k while k others of its host compute if
// it prefills (compute-bound throughout: its decode tokens ride in the
// prompt's matrix products), and d·j while j others of its host prefill if
// it only decodes (p, d: WorkerProfile::neighbor_slowdown; a memory-bound
// decode step suffers from a prefilling neighbour, and the profile
// measures nothing else). A neighbour that starts or ends mid-step moves
// the step's end; a step alone on its host takes exactly P + D.
#ifndef BATON_BENCH_SIM_SHARED_HOSTS_H_
#define BATON_BENCH_SIM_SHARED_HOSTS_H_

#include <cstdint>
#include <vector>

#include "worker/engine/cost_profile.h"

namespace baton::sim {

class SharedHosts {
 public:
  // Workers 0..workers-1, `per_host` to a host in order (>= 1).
  SharedHosts(const WorkerProfile::NeighborSlowdown& slowdown, int workers,
              int per_host);

  // A step's end: when worker `w` finishes, unless `version` has moved on.
  struct End {
    int worker;
    int64_t version;
    double t;
  };
  // Worker `w` (idle) starts a step at `now`; appends the new ends of every
  // step of its host (its own included) to `ends`.
  void Start(int w, double now, double prefill_s, double decode_s,
             std::vector<End>* ends);
  // Worker `w`'s step ended at `now` (its End's version is current);
  // appends the new ends of the others of its host to `ends`.
  void Finish(int w, double now, std::vector<End>* ends);
  // Whether an End of `w` is still its step's end.
  bool Current(int w, int64_t version) const;

 private:
  struct Step {
    bool busy = false;
    double prefill_s = 0, decode_s = 0;
    double left = 0;   // fraction of the step still to compute
    double since = 0;  // when `left` was last brought up to date
    int64_t version = 0;
  };
  struct Load {
    int busy = 0;        // steps computing
    int prefilling = 0;  // those that prefill
  };
  // Calls f(worker, step) for each busy step of `host`.
  template <typename F>
  void ForEachBusy(int host, F f);
  // The whole of step `s` at its host's current load.
  double Duration(int host, const Step& s) const;
  // Brings the host's steps up to `now` at its current load.
  void Advance(int host, double now);
  // New ends for the host's busy steps at its current load.
  void Schedule(int host, double now, std::vector<End>* ends);

  WorkerProfile::NeighborSlowdown slowdown_;
  int per_host_;
  std::vector<Step> steps_;
  std::vector<Load> load_;  // per host
};

}  // namespace baton::sim

#endif  // BATON_BENCH_SIM_SHARED_HOSTS_H_
