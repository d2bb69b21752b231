// A one-line progress bar for a running benchmark, redrawn in place with
// '\r' at most every `min_interval`, and finished with a newline.
#ifndef BATON_BENCH_SERVING_PROGRESS_H_
#define BATON_BENCH_SERVING_PROGRESS_H_

#include <ostream>

#include "absl/time/time.h"

namespace baton::bench {

struct ProgressCounts {
  int total = 0;  // requests in the workload
  int sent = 0;
  int done = 0;  // finished, successfully or not
  int failed = 0;
  double elapsed_s = 0;
};

class ProgressBar {
 public:
  // `out` must outlive the bar; typically std::cerr.
  explicit ProgressBar(std::ostream& out,
                       absl::Duration min_interval = absl::Milliseconds(200))
      : out_(out), min_interval_(min_interval) {}
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Redraws the line unless the last redraw was under min_interval ago.
  void Update(const ProgressCounts& counts);
  // Draws `counts` and ends the line; later calls do nothing.
  void Finish(const ProgressCounts& counts);

  // The text of one line (no '\r' or newline), e.g.
  // "[#########           ] 45/100 done, 2 failed, 12 in flight, 3.2 s".
  static std::string Line(const ProgressCounts& counts);

 private:
  std::ostream& out_;
  const absl::Duration min_interval_;
  absl::Time last_draw_ = absl::InfinitePast();
  bool finished_ = false;
};

}  // namespace baton::bench

#endif  // BATON_BENCH_SERVING_PROGRESS_H_
