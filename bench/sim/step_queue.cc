#include "bench/sim/step_queue.h"

#include <algorithm>

#include "common/check.h"

namespace baton::sim {

void StepQueue::AddWaiting(int r, int64_t prompt_tokens) {
  BATON_CHECK_GT(prompt_tokens, 0);
  waiting_.push_back({r, prompt_tokens, 0});
}

void StepQueue::AddRunning(int r, int64_t prompt_tokens) {
  BATON_CHECK_GT(prompt_tokens, 0);
  running_.push_back({r, prompt_tokens, prompt_tokens});
}

void StepQueue::Schedule(const Admit& admit, std::vector<Item>* items) {
  items->clear();
  int64_t budget = max_batch_tokens_;
  for (const Seq& s : running_) {
    if (budget <= 0) break;
    const bool decode = s.cached >= s.prompt;
    const int64_t n = decode ? 1 : std::min(s.prompt - s.cached, budget);
    items->push_back(
        {s.r, s.cached, n, decode || s.cached + n == s.prompt, decode});
    budget -= n;
  }
  while (!waiting_.empty() && budget > 0 &&
         static_cast<int64_t>(running_.size()) < max_num_seqs_) {
    Seq s = waiting_.front();
    const std::optional<int64_t> cached = admit(s.r);
    if (!cached.has_value()) break;
    BATON_CHECK(*cached >= 0 && *cached < s.prompt);
    waiting_.pop_front();
    s.cached = *cached;
    const int64_t n = std::min(s.prompt - s.cached, budget);
    items->push_back({s.r, s.cached, n, s.cached + n == s.prompt, false});
    running_.push_back(s);
    budget -= n;
  }
}

void StepQueue::Advance(const std::vector<Item>& items) {
  for (const Item& item : items) {
    if (item.decode) continue;
    Seq* s = Find(item.r);
    BATON_CHECK(s != nullptr);
    s->cached = item.start + item.tokens;
  }
}

void StepQueue::Remove(int r) {
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [r](const Seq& s) { return s.r == r; }),
                 running_.end());
}

StepQueue::Seq* StepQueue::Find(int r) {
  for (Seq& s : running_) {
    if (s.r == r) return &s;
  }
  return nullptr;
}

}  // namespace baton::sim
