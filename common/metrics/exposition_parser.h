// Reads the Prometheus text exposition format (0.0.4) back into samples:
// what tests and tools use to check a scrape of Registry().
//
//   # HELP name text          (comments are skipped)
//   name{label="value",...} 12.5 [timestamp]
#ifndef BATON_COMMON_METRICS_EXPOSITION_PARSER_H_
#define BATON_COMMON_METRICS_EXPOSITION_PARSER_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton::metrics {

using LabelSet = std::map<std::string, std::string>;

// One line of a scrape: a histogram appears as its name_bucket{le=...},
// name_sum and name_count samples.
struct Sample {
  std::string name;
  LabelSet labels;  // label values unescaped
  double value = 0;
};

// Every sample of `text`. InvalidArgument naming the line (1-based) and
// what is wrong with it for a malformed sample line.
absl::StatusOr<std::vector<Sample>> ParseExposition(absl::string_view text);

// The value of the one sample called `name` whose labels include every
// entry of `labels`. NotFound if none matches; FailedPrecondition if more
// than one does (name each distinguishing label).
absl::StatusOr<double> FindSample(const std::vector<Sample>& samples,
                                  absl::string_view name,
                                  const LabelSet& labels);

// The same on unparsed text (ParseExposition's error for bad text).
absl::StatusOr<double> FindSample(absl::string_view text,
                                  absl::string_view name,
                                  const LabelSet& labels);

}  // namespace baton::metrics

#endif  // BATON_COMMON_METRICS_EXPOSITION_PARSER_H_
