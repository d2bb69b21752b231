#include "bench/serving/progress.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace baton::bench {

std::string ProgressBar::Line(const ProgressCounts& c) {
  constexpr int kWidth = 30;
  const int filled =
      c.total > 0 ? std::clamp(c.done * kWidth / c.total, 0, kWidth) : kWidth;
  return absl::StrFormat("[%s%s] %d/%d done, %d failed, %d in flight, %.1f s",
                         std::string(filled, '#'),
                         std::string(kWidth - filled, ' '), c.done, c.total,
                         c.failed, c.sent - c.done, c.elapsed_s);
}

void ProgressBar::Update(const ProgressCounts& counts) {
  if (finished_) return;
  const absl::Time now = absl::Now();
  if (now - last_draw_ < min_interval_) return;
  last_draw_ = now;
  out_ << "\r" << Line(counts) << std::flush;
}

void ProgressBar::Finish(const ProgressCounts& counts) {
  if (finished_) return;
  finished_ = true;
  out_ << "\r" << Line(counts) << "\n" << std::flush;
}

}  // namespace baton::bench
