#include "common/metrics/exposition_parser.h"

#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace baton::metrics {
namespace {

bool IsNameChar(char c, bool first) {
  return absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_' ||
         c == ':' ||
         (!first && absl::ascii_isdigit(static_cast<unsigned char>(c)));
}

// Consumes a metric or label name at the front of `rest`.
bool TakeName(absl::string_view* rest, std::string* name) {
  size_t n = 0;
  while (n < rest->size() && IsNameChar((*rest)[n], n == 0)) ++n;
  if (n == 0) return false;
  *name = std::string(rest->substr(0, n));
  rest->remove_prefix(n);
  return true;
}

// Consumes a quoted label value ("..." with \\, \" and \n escapes).
bool TakeQuoted(absl::string_view* rest, std::string* value) {
  if (rest->empty() || rest->front() != '"') return false;
  rest->remove_prefix(1);
  value->clear();
  while (!rest->empty()) {
    const char c = rest->front();
    rest->remove_prefix(1);
    if (c == '"') return true;
    if (c != '\\') {
      value->push_back(c);
      continue;
    }
    if (rest->empty()) return false;
    const char escaped = rest->front();
    rest->remove_prefix(1);
    if (escaped == 'n') {
      value->push_back('\n');
    } else if (escaped == '\\' || escaped == '"') {
      value->push_back(escaped);
    } else {
      return false;
    }
  }
  return false;
}

bool ParseValue(absl::string_view text, double* value) {
  if (text == "+Inf" || text == "Inf") {
    *value = std::numeric_limits<double>::infinity();
    return true;
  }
  if (text == "-Inf") {
    *value = -std::numeric_limits<double>::infinity();
    return true;
  }
  if (text == "NaN") {
    *value = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  return absl::SimpleAtod(text, value);
}

absl::StatusOr<Sample> ParseLine(absl::string_view line, int line_number) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics text line ", line_number, ": ", what, " in '", line, "'"));
  };
  Sample sample;
  absl::string_view rest = line;
  if (!TakeName(&rest, &sample.name)) return bad("no metric name");
  if (!rest.empty() && rest.front() == '{') {
    rest.remove_prefix(1);
    while (true) {
      if (rest.empty()) return bad("unterminated label set");
      if (rest.front() == '}') {
        rest.remove_prefix(1);
        break;
      }
      std::string label;
      std::string value;
      if (!TakeName(&rest, &label)) return bad("bad label name");
      if (rest.empty() || rest.front() != '=') return bad("no '=' after label");
      rest.remove_prefix(1);
      if (!TakeQuoted(&rest, &value)) return bad("bad label value");
      if (!sample.labels.emplace(std::move(label), std::move(value)).second) {
        return bad("repeated label");
      }
      if (!rest.empty() && rest.front() == ',') rest.remove_prefix(1);
    }
  }
  const std::vector<absl::string_view> fields =
      absl::StrSplit(absl::StripAsciiWhitespace(rest), ' ', absl::SkipEmpty());
  if (fields.empty() || fields.size() > 2) {
    return bad("expected a value and an optional timestamp");
  }
  if (!ParseValue(fields[0], &sample.value)) return bad("bad value");
  return sample;
}

}  // namespace

absl::StatusOr<std::vector<Sample>> ParseExposition(absl::string_view text) {
  std::vector<Sample> samples;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    absl::StatusOr<Sample> sample = ParseLine(line, line_number);
    if (!sample.ok()) return sample.status();
    samples.push_back(std::move(*sample));
  }
  return samples;
}

absl::StatusOr<double> FindSample(const std::vector<Sample>& samples,
                                  absl::string_view name,
                                  const LabelSet& labels) {
  const Sample* found = nullptr;
  for (const Sample& sample : samples) {
    if (sample.name != name) continue;
    bool match = true;
    for (const auto& [label, value] : labels) {
      auto it = sample.labels.find(label);
      if (it == sample.labels.end() || it->second != value) {
        match = false;
        break;
      }
    }
    if (!match) continue;
    if (found != nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "more than one sample of ", name, " matches the labels given"));
    }
    found = &sample;
  }
  if (found == nullptr) {
    std::string wanted;
    for (const auto& [label, value] : labels) {
      absl::StrAppend(&wanted, wanted.empty() ? "" : ",", label, "=\"", value,
                      "\"");
    }
    return absl::NotFoundError(
        absl::StrCat("no sample ", name, "{", wanted, "}"));
  }
  return found->value;
}

absl::StatusOr<double> FindSample(absl::string_view text,
                                  absl::string_view name,
                                  const LabelSet& labels) {
  absl::StatusOr<std::vector<Sample>> samples = ParseExposition(text);
  if (!samples.ok()) return samples.status();
  return FindSample(*samples, name, labels);
}

}  // namespace baton::metrics
