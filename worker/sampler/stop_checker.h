// Stop strings over streamed output text.
//
// Text arrives in deltas (one per detokenized step). Push() returns the part
// that can be emitted now: everything except the longest suffix that could
// still grow into a stop string. When a stop string completes, emission ends
// right before its first occurrence (the stop string itself is never
// emitted, vLLM's default) and the checker is stopped. Matching is on bytes;
// since a held-back suffix starts where a stop string would start, emits
// split valid UTF-8 only where the deltas themselves do.
#ifndef BATON_WORKER_SAMPLER_STOP_CHECKER_H_
#define BATON_WORKER_SAMPLER_STOP_CHECKER_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace baton {

class StopChecker {
 public:
  struct Result {
    // Text that is safe to send to the client now.
    std::string emit;
    // A stop string completed; the request is finished.
    bool stopped = false;
  };

  // stops: the request's stop strings; empty ones are ignored (Validate
  // rejects them).
  explicit StopChecker(std::vector<std::string> stops);

  // Appends `text_delta` to the output. After a stop, returns {"", true}.
  Result Push(absl::string_view text_delta);

  // For an end for another reason (EOS, max_tokens): returns the held-back
  // text and clears it. "" after a stop.
  std::string Finish();

  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  // Pending output: a suffix that is a proper prefix of some stop string.
  std::string held_;
  bool stopped_ = false;
};

}  // namespace baton

#endif  // BATON_WORKER_SAMPLER_STOP_CHECKER_H_
