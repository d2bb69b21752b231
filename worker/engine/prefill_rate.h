// How fast an engine prefills, as the coordinator's admission needs it:
// prompt tokens per second of step time over the recent steps that carried
// prompt tokens (each older step weighs kDecay times the next one), so a
// change of load shows within a few steps while one odd step does not swing
// it. Steps that also decode count whole, which makes the rate a little
// low: admission then errs towards refusing.
#ifndef BATON_WORKER_ENGINE_PREFILL_RATE_H_
#define BATON_WORKER_ENGINE_PREFILL_RATE_H_

#include <atomic>
#include <cstdint>

namespace baton {

class PrefillRate {
 public:
  static constexpr double kDecay = 0.75;

  // A step that fed `prompt_tokens` (> 0) took `seconds` (> 0); others are
  // ignored. One thread (the engine's).
  void Record(int64_t prompt_tokens, double seconds) {
    if (prompt_tokens <= 0 || !(seconds > 0)) return;
    tokens_ = kDecay * tokens_ + static_cast<double>(prompt_tokens);
    seconds_ = kDecay * seconds_ + seconds;
    published_.store(tokens_ / seconds_, std::memory_order_relaxed);
  }
  // 0 until a step was recorded. Any thread.
  double tokens_per_second() const {
    return published_.load(std::memory_order_relaxed);
  }

 private:
  double tokens_ = 0;
  double seconds_ = 0;
  std::atomic<double> published_{0};
};

}  // namespace baton

#endif  // BATON_WORKER_ENGINE_PREFILL_RATE_H_
