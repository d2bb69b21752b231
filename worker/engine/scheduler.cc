#include "worker/engine/scheduler.h"

#include <algorithm>
#include <iterator>
#include <tuple>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace baton {

int64_t FcfsArrival(int64_t stamped_us, int64_t here_us) {
  if (stamped_us <= 0) return here_us;
  return std::clamp(stamped_us, here_us - kMaxArrivalLeadUs, here_us);
}

int64_t FcfsArrivalNow(int64_t stamped_us) {
  return FcfsArrival(stamped_us, absl::ToUnixMicros(absl::Now()));
}

void Scheduler::AddWaiting(Sequence* seq) {
  const auto arrived_after = [seq](const Sequence* other) {
    return std::tie(other->arrival_us, other->arrival_order) >
           std::tie(seq->arrival_us, seq->arrival_order);
  };
  auto it = waiting_.end();
  while (it != waiting_.begin() && arrived_after(*std::prev(it))) --it;
  waiting_.insert(it, seq);
}

void Scheduler::Remove(Sequence* seq) {
  Detach(seq);
  cache_->Free(seq->table);
  seq->num_cached = 0;
  seq->num_published = 0;
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
  seq->num_published = 0;
  waiting_.push_front(seq);
}

bool Scheduler::Admit(Sequence* seq) {
  const int64_t total = static_cast<int64_t>(seq->tokens.size());
  BlockAllocator& allocator = cache_->allocator();
  std::span<const BlockHash> prefix;
  if (prefix_.enabled && seq->table.empty()) {
    // Full blocks before the one holding the last token.
    const int64_t shareable = (total - 1) / allocator.block_size();
    ExtendBlockHashes(prefix_.root, seq->tokens, allocator.block_size(),
                      shareable, &seq->block_hashes);
    prefix =
        std::span<const BlockHash>(seq->block_hashes)
            .first(static_cast<size_t>(std::min<int64_t>(
                shareable, static_cast<int64_t>(seq->block_hashes.size()))));
    prefix = prefix.first(static_cast<size_t>(allocator.MatchPrefix(prefix)));
  }
  if (!allocator.CanReserveWithPrefix(prefix, total)) return false;
  allocator.AcquirePrefix(seq->table, prefix);
  // CanReserveWithPrefix held, so Reserve cannot fail.
  (void)allocator.Reserve(seq->table, total);
  const int64_t hit =
      static_cast<int64_t>(prefix.size()) * allocator.block_size();
  seq->num_cached = hit;
  seq->num_published = static_cast<int64_t>(prefix.size());
  if (prefix_.enabled && !seq->admitted) {
    prefix_query_tokens_ += total;
    prefix_hit_tokens_ += hit;
    seq->metrics.cached_tokens = hit;
  }
  seq->admitted = true;
  return true;
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
    if (!Admit(seq)) break;
    waiting_.pop_front();
    running_.push_back(seq);
    const int64_t n = std::min(seq->num_uncached(), budget);
    items.push_back({seq, n, n == seq->num_uncached()});
    budget -= n;
  }
  return items;
}

void PublishFullBlocks(const BlockHash& root, BlockAllocator& allocator,
                       Sequence* seq) {
  const int64_t block_size = allocator.block_size();
  const int64_t full = seq->num_cached / block_size;
  if (full <= seq->num_published) return;
  ExtendBlockHashes(root, seq->tokens, block_size, full, &seq->block_hashes);
  for (int64_t i = seq->num_published; i < full; ++i) {
    allocator.Publish(seq->table, i, seq->block_hashes[static_cast<size_t>(i)]);
  }
  seq->num_published = full;
}

}  // namespace baton
