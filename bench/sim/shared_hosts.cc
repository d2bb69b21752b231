#include "bench/sim/shared_hosts.h"

#include <algorithm>

#include "common/check.h"

namespace baton::sim {

SharedHosts::SharedHosts(const WorkerProfile::NeighborSlowdown& slowdown,
                         int workers, int per_host)
    : slowdown_(slowdown),
      per_host_(per_host),
      steps_(static_cast<size_t>(workers)),
      load_(static_cast<size_t>((workers + per_host - 1) / per_host)) {
  BATON_CHECK(per_host >= 1);
}

double SharedHosts::Duration(int host, const Step& s) const {
  const Load& load = load_[static_cast<size_t>(host)];
  // A step that prefills is compute-bound throughout (its decode tokens
  // ride in the prompt's matrix products) and slows beside any busy
  // neighbour; a decode-only step slows beside the ones that prefill.
  const double slowdown = s.prefill_s > 0 ? slowdown_.prefill * (load.busy - 1)
                                          : slowdown_.decode * load.prefilling;
  return (s.prefill_s + s.decode_s) * (1 + slowdown);
}

template <typename F>
void SharedHosts::ForEachBusy(int host, F f) {
  const int end =
      std::min((host + 1) * per_host_, static_cast<int>(steps_.size()));
  for (int w = host * per_host_; w < end; ++w) {
    Step& s = steps_[static_cast<size_t>(w)];
    if (s.busy) f(w, s);
  }
}

void SharedHosts::Advance(int host, double now) {
  ForEachBusy(host, [&](int, Step& s) {
    const double d = Duration(host, s);
    if (d > 0) s.left = std::max(0.0, s.left - (now - s.since) / d);
    s.since = now;
  });
}

void SharedHosts::Schedule(int host, double now, std::vector<End>* ends) {
  ForEachBusy(host, [&](int w, Step& s) {
    ++s.version;
    ends->push_back({w, s.version, now + s.left * Duration(host, s)});
  });
}

void SharedHosts::Start(int w, double now, double prefill_s, double decode_s,
                        std::vector<End>* ends) {
  const int host = w / per_host_;
  Step& s = steps_[static_cast<size_t>(w)];
  BATON_CHECK(!s.busy);
  Advance(host, now);
  s = {true, prefill_s, decode_s, 1.0, now, s.version};
  Load& load = load_[static_cast<size_t>(host)];
  ++load.busy;
  if (prefill_s > 0) ++load.prefilling;
  Schedule(host, now, ends);
}

void SharedHosts::Finish(int w, double now, std::vector<End>* ends) {
  const int host = w / per_host_;
  Advance(host, now);
  Step& s = steps_[static_cast<size_t>(w)];
  s.busy = false;
  Load& load = load_[static_cast<size_t>(host)];
  --load.busy;
  if (s.prefill_s > 0) --load.prefilling;
  Schedule(host, now, ends);
}

bool SharedHosts::Current(int w, int64_t version) const {
  return steps_[static_cast<size_t>(w)].version == version;
}

}  // namespace baton::sim
