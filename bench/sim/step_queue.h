// One simulated worker's engine queues, composing each step as the engine's
// Scheduler does (worker/engine/scheduler.h), on token counts alone:
//   1. the running sequences, in admission order, each take what they still
//      lack (a prompt's rest, chunked; one token when decoding) while the
//      step's token budget lasts;
//   2. waiting prompts are admitted, first come first served, while budget
//      and max_num_seqs allow (and the caller's admission check holds),
//      each prefilled with what is left of the budget;
//   3. imported sequences (a decode worker's landed KV) join the running
//      ones directly and count against max_num_seqs for admissions only.
// Preemption is not modelled: the simulator reserves a request's blocks in
// full before it runs. step_queue_test checks the composition step by step
// against the real Scheduler.
#ifndef BATON_BENCH_SIM_STEP_QUEUE_H_
#define BATON_BENCH_SIM_STEP_QUEUE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <vector>

namespace baton::sim {

class StepQueue {
 public:
  StepQueue(int64_t max_num_seqs, int64_t max_batch_tokens)
      : max_num_seqs_(max_num_seqs), max_batch_tokens_(max_batch_tokens) {}

  // A prompt of `prompt_tokens` waits for prefill (request `r`).
  void AddWaiting(int r, int64_t prompt_tokens);
  // Request `r` runs from now on, its prompt in the cache (decoding).
  void AddRunning(int r, int64_t prompt_tokens);

  struct Item {
    int r;
    int64_t start;   // tokens already in the cache
    int64_t tokens;  // fed this step
    bool samples;    // the step ends its prompt or is a decode
    bool decode;     // one token of output (its prompt is cached)
  };
  // Admission of a waiting prompt: the tokens its prefix cache holds, fewer
  // than the prompt's (it is prefilled from there), or nullopt when it
  // cannot start now (it and the prompts behind it wait).
  using Admit = std::function<std::optional<int64_t>(int r)>;
  // Replaces *items with the next step's (none when there is nothing to
  // do). Items start where the last step left their sequence: call Advance
  // once it ran.
  void Schedule(const Admit& admit, std::vector<Item>* items);
  // The step of `items` ran: each sequence holds what it was fed.
  void Advance(const std::vector<Item>& items);
  // Request `r` leaves the running sequences (it finished, or its prompt
  // was handed off).
  void Remove(int r);

  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }

 private:
  struct Seq {
    int r;
    int64_t prompt;  // prompt tokens
    int64_t cached;  // of them in the cache; == prompt once decoding
  };
  Seq* Find(int r);

  int64_t max_num_seqs_;
  int64_t max_batch_tokens_;
  std::deque<Seq> waiting_;
  std::vector<Seq> running_;  // admission order
};

}  // namespace baton::sim

#endif  // BATON_BENCH_SIM_STEP_QUEUE_H_
