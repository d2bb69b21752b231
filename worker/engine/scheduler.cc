#include "worker/engine/scheduler.h"

#include <algorithm>

namespace baton {

void Scheduler::Remove(Sequence* seq) {
  Detach(seq);
  cache_->Free(seq->table);
  seq->num_cached = 0;
}

void Scheduler::Detach(Sequence* seq) {
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), seq),
                 waiting_.end());
  running_.erase(std::remove(running_.begin(), running_.end(), seq),
                 running_.end());
}

void Scheduler::Preempt(Sequence* seq) {
  running_.erase(std::remove(running_.begin(), running_.end(), seq),
                 running_.end());
  cache_->Free(seq->table);
  seq->num_cached = 0;
  waiting_.push_front(seq);
}

std::vector<ScheduledItem> Scheduler::Schedule(
    std::vector<Sequence*>* preempted) {
  std::vector<ScheduledItem> items;
  int64_t budget = options_.max_num_batched_tokens;

  // 1. Running sequences: decodes (1 token) and unfinished prefills.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* seq = running_[i];
    const int64_t n = std::min(seq->num_uncached(), budget);
    const int64_t needed = seq->num_cached + n;
    bool preempted_self = false;
    while (!cache_->CanReserve(seq->table, needed)) {
      Sequence* victim = running_.back();
      Preempt(victim);
      preempted->push_back(victim);
      if (victim == seq) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) continue;  // running_[i] is now the next sequence
    // CanReserve held, so Reserve cannot fail.
    (void)cache_->Reserve(seq->table, needed);
    items.push_back({seq, n, n == seq->num_uncached()});
    budget -= n;
    ++i;
  }

  // 2. Admit waiting sequences while the budget, the batch and the pool
  //    allow; a prompt's blocks are reserved whole at admission.
  while (!waiting_.empty() && budget > 0 &&
         static_cast<int64_t>(running_.size()) < options_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    const int64_t total = static_cast<int64_t>(seq->tokens.size());
    if (!cache_->CanReserve(seq->table, total)) break;
    (void)cache_->Reserve(seq->table, total);
    waiting_.pop_front();
    running_.push_back(seq);
    const int64_t n = std::min(seq->num_uncached(), budget);
    items.push_back({seq, n, n == seq->num_uncached()});
    budget -= n;
  }
  return items;
}

}  // namespace baton
