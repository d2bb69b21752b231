#include "worker/sampler/stop_checker.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace baton {

StopChecker::StopChecker(std::vector<std::string> stops) {
  for (std::string& stop : stops) {
    if (!stop.empty()) stops_.push_back(std::move(stop));
  }
}

StopChecker::Result StopChecker::Push(absl::string_view text_delta) {
  Result result;
  if (stopped_) {
    result.stopped = true;
    return result;
  }
  std::string text = absl::StrCat(held_, text_delta);
  held_.clear();
  // held_ never contains a whole stop string, so the first occurrence in
  // `text` is the first one in the output.
  size_t first = std::string::npos;
  for (const std::string& stop : stops_) {
    first = std::min(first, text.find(stop));
  }
  if (first != std::string::npos) {
    stopped_ = true;
    text.resize(first);
    result.emit = std::move(text);
    result.stopped = true;
    return result;
  }
  // Longest suffix of `text` that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    const size_t max_len = std::min(stop.size() - 1, text.size());
    for (size_t len = max_len; len > hold; --len) {
      if (absl::string_view(text).substr(text.size() - len) ==
          absl::string_view(stop).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  held_ = text.substr(text.size() - hold);
  text.resize(text.size() - hold);
  result.emit = std::move(text);
  return result;
}

std::string StopChecker::Finish() { return std::exchange(held_, {}); }

}  // namespace baton
