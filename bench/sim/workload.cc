#include "bench/sim/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "bench/serving/arrivals.h"
#include "nlohmann/json.hpp"

namespace baton::sim {

namespace {

// Mooncake's JSONL: one object per line with timestamp (ms), input_length,
// output_length and hash_ids (one per 512-token piece of the prompt).
absl::StatusOr<std::vector<SimRequest>> ReadMooncake(const std::string& path,
                                                     std::ifstream& in) {
  std::vector<SimRequest> out;
  std::string line;
  for (int row = 1; std::getline(in, line); ++row) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    SimRequest r;
    bool ok = j.is_object() && j.contains("timestamp") &&
              j["timestamp"].is_number() && j.contains("input_length") &&
              j["input_length"].is_number_integer() &&
              j.contains("output_length") &&
              j["output_length"].is_number_integer();
    if (ok) {
      r.arrival_s = j["timestamp"].get<double>() / 1e3;
      r.input_len = j["input_length"].get<int64_t>();
      r.output_len = j["output_length"].get<int64_t>();
      if (j.contains("hash_ids")) {
        const nlohmann::json& ids = j["hash_ids"];
        ok = ids.is_array();
        for (size_t i = 0; ok && i < ids.size(); ++i) {
          ok = ids[i].is_number_integer();
          if (ok) r.piece_ids.push_back(ids[i].get<int64_t>());
        }
      }
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", row,
                       ": want {\"timestamp\": ms, \"input_length\": n, "
                       "\"output_length\": n, \"hash_ids\": [...]}, got '",
                       line.substr(0, 200), "'"));
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<SimRequest>> ReadTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  if (in.peek() == '{') {
    auto requests = ReadMooncake(path, in);
    if (!requests.ok()) return requests.status();
    std::stable_sort(requests->begin(), requests->end(),
                     [](const SimRequest& a, const SimRequest& b) {
                       return a.arrival_s < b.arrival_s;
                     });
    return requests;
  }
  std::string line;
  std::getline(in, line);
  const bool azure = line.rfind("TIMESTAMP", 0) == 0;
  if (!azure && line.rfind("timestamp_s", 0) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     ": header must be timestamp_s,input_len,output_len or "
                     "TIMESTAMP,ContextTokens,GeneratedTokens, or JSON lines "
                     "as Mooncake's traces"));
  }
  std::vector<SimRequest> out;
  absl::Time first = absl::InfinitePast();
  for (int row = 2; std::getline(in, line); ++row) {
    if (line.empty()) continue;
    std::vector<std::string> f = absl::StrSplit(line, ',');
    SimRequest r;
    bool ok = f.size() == 3 && absl::SimpleAtoi(f[1], &r.input_len) &&
              absl::SimpleAtoi(f[2], &r.output_len);
    if (ok && azure) {
      absl::Time t;
      std::string error;
      ok = absl::ParseTime("%Y-%m-%d %H:%M:%E*S", f[0], &t, &error);
      if (first == absl::InfinitePast()) first = t;
      r.arrival_s = absl::ToDoubleSeconds(t - first);
    } else if (ok) {
      ok = absl::SimpleAtod(f[0], &r.arrival_s);
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", row, ": cannot read '", line, "'"));
    }
    out.push_back(r);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const SimRequest& a, const SimRequest& b) {
                     return a.arrival_s < b.arrival_s;
                   });
  return out;
}

absl::StatusOr<std::vector<SimRequest>> MakeWorkload(const WorkloadOptions& o) {
  if (!o.trace.empty()) return ReadTrace(o.trace);
  bench::ArrivalOptions arrivals;
  arrivals.request_rate = o.request_rate;
  arrivals.burstiness = o.burstiness;
  auto offsets = bench::ArrivalOffsets(o.num_prompts, arrivals, o.seed);
  if (!offsets.ok()) return offsets.status();
  const double ratio = o.range_ratio;
  if (!(ratio >= 0 && ratio < 1)) {
    return absl::InvalidArgumentError("--random_range_ratio: in [0, 1)");
  }
  std::mt19937_64 rng(o.seed ^ 0x5eedULL);
  auto length = [&](int32_t mean) {
    const auto lo = std::max<int64_t>(1, std::llround(mean * (1 - ratio)));
    const auto hi = std::max<int64_t>(lo, std::llround(mean * (1 + ratio)));
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  std::vector<SimRequest> out;
  for (double t : *offsets) {
    SimRequest r;
    r.arrival_s = t;
    r.input_len = length(o.input_len);
    r.output_len = length(o.output_len);
    out.push_back(r);
  }
  return out;
}

}  // namespace baton::sim
