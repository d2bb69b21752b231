#include "bench/sim/neighbors.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_format.h"

namespace baton::sim {
namespace {

// One request's token times (s since the run's start): the first token,
// then each later one.
std::vector<double> TokenTimes(const bench::RequestRecord& r) {
  std::vector<double> t{r.send_time_s + r.ttft_ms / 1e3};
  for (double gap : r.itl_ms) t.push_back(t.back() + gap / 1e3);
  return t;
}

// Total length of the union of `spans`.
double Covered(std::vector<std::pair<double, double>> spans) {
  std::sort(spans.begin(), spans.end());
  double covered = 0, start = 0, end = -1;
  for (const auto& [s, e] : spans) {
    if (s > end) {
      if (end > start) covered += end - start;
      start = s;
      end = e;
    } else {
      end = std::max(end, e);
    }
  }
  if (end > start) covered += end - start;
  return covered;
}

struct Timeline {
  int64_t prompt = 0;
  std::vector<double> t;
};

// The successful requests' token times, by first token.
std::vector<Timeline> Timelines(
    const std::vector<bench::RequestRecord>& records) {
  std::vector<Timeline> all;
  for (const bench::RequestRecord& r : records) {
    if (r.success) all.push_back({r.prompt_tokens, TokenTimes(r)});
  }
  std::sort(all.begin(), all.end(), [](const Timeline& a, const Timeline& b) {
    return a.t.front() < b.t.front();
  });
  return all;
}

// The median of `v` (the upper one of an even count).
double MedianOf(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// The decode gaps of `all` that lie inside [a, b], each against the fit
// for the batch decoding at its middle; *spans: the gaps' spans.
DecodeTimes TimeDecodeGaps(const std::vector<Timeline>& all, double a, double b,
                           const WorkerProfile& profile,
                           std::vector<std::pair<double, double>>* spans) {
  DecodeTimes times;
  for (const Timeline& tl : all) {
    for (size_t i = 1; i + 1 < tl.t.size(); ++i) {
      const double s = tl.t[i], end = tl.t[i + 1], mid = (s + end) / 2;
      if (s < a || end > b) continue;
      int64_t batch = 0, context = 0;
      for (const Timeline& other : all) {
        if (other.t.size() < 2 || mid < other.t.front() ||
            mid >= other.t.back()) {
          continue;
        }
        const auto done =
            std::upper_bound(other.t.begin(), other.t.end(), mid) -
            other.t.begin();
        ++batch;
        context += other.prompt + done;
      }
      DecodeTimes::Cell& cell = times.by_batch[batch];
      cell.measured_s += end - s;
      cell.predicted_s += DecodeSeconds(profile, context, batch);
      ++cell.gaps;
      if (spans != nullptr) spans->emplace_back(s, end);
    }
  }
  return times;
}

}  // namespace

void DecodeTimes::Add(const DecodeTimes& other) {
  for (const auto& [batch, c] : other.by_batch) {
    Cell& mine = by_batch[batch];
    mine.measured_s += c.measured_s;
    mine.predicted_s += c.predicted_s;
    mine.gaps += c.gaps;
  }
}

int DecodeTimes::gaps() const {
  int n = 0;
  for (const auto& [batch, c] : by_batch) n += c.gaps;
  return n;
}

double DecodeTimes::Ratio() const {
  double measured = 0, predicted = 0;
  for (const auto& [batch, c] : by_batch) {
    measured += c.measured_s;
    predicted += c.predicted_s;
  }
  return predicted > 0 ? measured / predicted : 1;
}

double DecodeTimes::RatioAt(int64_t batch) const {
  const Cell* nearest = nullptr;
  int64_t distance = 0;
  for (const auto& [b, c] : by_batch) {
    if (c.gaps < kMinGaps || c.predicted_s <= 0) continue;
    const int64_t d = b > batch ? b - batch : batch - b;
    // Ascending batches: a later one as near is the larger; keep the first.
    if (nearest == nullptr || d < distance) {
      nearest = &c;
      distance = d;
    }
  }
  return nearest != nullptr ? nearest->ratio() : 1;
}

NeighborEstimate MedianNeighborEstimate(
    const std::vector<NeighborEstimate>& runs) {
  NeighborEstimate m;
  // The median of one field over the runs, set on `m`.
  const auto median = [&](auto field) {
    std::vector<double> v;
    for (const NeighborEstimate& e : runs) v.push_back(field(e));
    return MedianOf(std::move(v));
  };
  for (double NeighborEstimate::*f :
       {&NeighborEstimate::prefill_alone, &NeighborEstimate::decode_alone,
        &NeighborEstimate::decode_level, &NeighborEstimate::prefill_ratio,
        &NeighborEstimate::decode_ratio, &NeighborEstimate::decode_busy,
        &NeighborEstimate::decode_batch}) {
    m.*f = median([f](const NeighborEstimate& e) { return e.*f; });
  }
  for (double WorkerProfile::NeighborSlowdown::*f :
       {&WorkerProfile::NeighborSlowdown::prefill,
        &WorkerProfile::NeighborSlowdown::decode}) {
    m.slowdown.*f =
        median([f](const NeighborEstimate& e) { return e.slowdown.*f; });
  }
  for (const NeighborEstimate& e : runs) {
    m.prefill_steps += e.prefill_steps;
    m.decode_steps += e.decode_steps;
    m.decode.Add(e.decode);
  }
  return m;
}

std::string NeighborEstimate::Describe() const {
  return absl::StrFormat(
      "prefill steps %.3fx the fit (%d steps, the decode worker busy %.0f%% "
      "of them; alone %.3fx), decode steps %.3fx (%d steps; alone %.3fx) "
      "beside them, %.2f decoding in a step; neighbor_slowdown prefill %.3f, "
      "decode %.3f; the decode level %.3fx",
      prefill_ratio, prefill_steps, 100 * decode_busy, prefill_alone,
      decode_ratio, decode_steps, decode_alone, decode_batch, slowdown.prefill,
      slowdown.decode, decode_level);
}

absl::StatusOr<double> PrefillBurstRatio(
    const std::vector<bench::RequestRecord>& records,
    const WorkerProfile& profile, int* timed) {
  const std::vector<Timeline> all = Timelines(records);
  // Prefill steps, told apart by their first tokens: those within a
  // quarter of a step of the first of a group came from one step.
  std::vector<std::vector<int64_t>> steps;
  double group_start = -1;
  for (const Timeline& tl : all) {
    const int64_t l = tl.prompt;
    const double quarter = PrefillSeconds(profile, std::span(&l, 1)) / 4;
    if (steps.empty() || tl.t.front() > group_start + quarter) {
      steps.emplace_back();
      group_start = tl.t.front();
    }
    steps.back().push_back(l);
  }
  double predicted = 0;
  for (size_t s = 1; s < steps.size(); ++s) {
    predicted += PrefillSeconds(profile, steps[s]);
  }
  *timed = steps.empty() ? 0 : static_cast<int>(steps.size()) - 1;
  if (*timed < 2 || predicted <= 0) {
    return absl::FailedPreconditionError(
        "neighbours: the burst's prompts came out of fewer than 3 prefill "
        "steps (send more requests)");
  }
  return (all.back().t.front() - all.front().t.front()) / predicted;
}

absl::StatusOr<NeighborEstimate> EstimateNeighborSlowdown(
    const std::vector<bench::RequestRecord>& records,
    const WorkerProfile& profile, const NeighborBaseline& baseline) {
  const std::vector<Timeline> all = Timelines(records);
  if (all.size() < 2) {
    return absl::FailedPreconditionError("neighbours: fewer than 2 requests");
  }
  NeighborEstimate e;
  auto prefill = PrefillBurstRatio(records, profile, &e.prefill_steps);
  if (!prefill.ok()) return prefill.status();
  e.prefill_ratio = *prefill;
  const double a = all.front().t.front(), b = all.back().t.front();
  std::vector<std::pair<double, double>> spans;
  e.decode = TimeDecodeGaps(all, a, b, profile, &spans);
  e.decode_steps = e.decode.gaps();
  // Each batch's gaps against the fit scaled by the baseline's ratio at
  // that batch.
  double measured = 0, predicted = 0, expected = 0, steps = 0;
  for (const auto& [batch, c] : e.decode.by_batch) {
    measured += c.measured_s;
    predicted += c.predicted_s;
    expected += c.predicted_s * baseline.decode.RatioAt(batch);
    steps += static_cast<double>(c.gaps) / static_cast<double>(batch);
  }
  if (e.decode_steps == 0 || predicted <= 0) {
    return absl::FailedPreconditionError(
        "neighbours: no decode step between the first and the last first "
        "token (send more requests, or longer answers)");
  }
  e.decode_ratio = measured / predicted;
  e.decode_alone = expected / predicted;
  e.decode_batch = e.decode_steps / steps;
  e.prefill_alone = baseline.prefill_ratio;
  e.decode_busy = b > a ? Covered(std::move(spans)) / (b - a) : 0;
  e.slowdown.decode = std::max(0.0, measured / expected - 1);
  e.slowdown.prefill =
      e.decode_busy > 0
          ? std::max(0.0, (e.prefill_ratio / baseline.prefill_ratio - 1) /
                              e.decode_busy)
          : 0;
  return e;
}

DecodeTimes DecodeAloneTimes(const std::vector<bench::RequestRecord>& records,
                             const WorkerProfile& profile) {
  const std::vector<Timeline> all = Timelines(records);
  if (all.empty()) return {};
  // After the last first token the prefill worker idles.
  return TimeDecodeGaps(all, all.back().t.front(),
                        std::numeric_limits<double>::infinity(), profile,
                        nullptr);
}

}  // namespace baton::sim
