#include "bench/sim/profiler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "baton/v1/api.grpc.pb.h"
#include "bench/serving/dataset.h"
#include "bench/serving/runner.h"
#include "bench/sim/fit.h"
#include "bench/sim/neighbors.h"

namespace baton::sim {
namespace {

struct ClusterShape {
  bool split = false;
  int64_t kv_blocks = 0;
  int64_t block_size = 0;
  int64_t kv_bytes_per_token = 0;
};

absl::StatusOr<ClusterShape> ReadCluster(grpc::Channel& channel) {
  auto stub = v1::Baton::NewStub(
      std::shared_ptr<grpc::Channel>(&channel, [](grpc::Channel*) {}));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  v1::GetClusterStatusResponse status;
  const grpc::Status rpc = stub->GetClusterStatus(&context, {}, &status);
  if (!rpc.ok()) {
    return absl::UnavailableError(
        absl::StrCat("GetClusterStatus: ", rpc.error_message()));
  }
  ClusterShape shape;
  for (const v1::WorkerStatus& w : status.workers()) {
    if (w.health() != v1::WORKER_HEALTH_HEALTHY) continue;
    if (w.role() == v1::WORKER_ROLE_PREFILL) shape.split = true;
    if (w.role() == v1::WORKER_ROLE_PREFILL || shape.kv_blocks > 0) continue;
    const v1::KvLayout& layout = w.kv_layout();
    const int64_t dtype_bytes = layout.dtype() == v1::KV_DTYPE_F32 ? 4 : 2;
    shape.kv_blocks = w.load().kv_blocks_total();
    shape.block_size = layout.block_size();
    shape.kv_bytes_per_token = 2 * int64_t{layout.num_layers()} *
                               layout.num_kv_heads() * layout.head_dim() *
                               dtype_bytes;
  }
  if (shape.kv_blocks <= 0 || shape.block_size <= 0) {
    return absl::FailedPreconditionError(
        "no healthy decode or colocated worker to profile");
  }
  return shape;
}

// Runs `count` prompts of `len` tokens, `out` tokens each, `concurrency`
// at a time; only successful records are returned.
absl::StatusOr<std::vector<bench::RequestRecord>> Run(
    std::shared_ptr<grpc::Channel> channel, int count, int len, int out,
    int concurrency, uint64_t seed, const ProfileOptions& options) {
  bench::RandomDatasetOptions data;
  data.num_prompts = count;
  data.input_len = len;
  data.output_len = out;
  auto prompts = bench::SampleRandomPrompts(data, seed);
  if (!prompts.ok()) return prompts.status();
  bench::RunnerOptions runner;
  runner.max_concurrency = concurrency;
  runner.request_timeout_s = options.request_timeout_s;
  runner.seed = seed;
  runner.request_id_prefix = absl::StrCat("profile-", seed, "-");
  auto run = bench::RunWorkload(std::move(channel), *prompts, runner);
  if (!run.ok()) return run.status();
  std::vector<bench::RequestRecord> ok;
  for (const bench::RequestRecord& r : run->records) {
    if (!r.success) {
      return absl::UnavailableError(absl::StrCat(
          "a profiling request (", len, " prompt tokens) failed: ",
          absl::StatusCodeToString(r.error_code), " ", r.error_message));
    }
    ok.push_back(r);
  }
  return ok;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// The neighbours' baseline (neighbors.h), beside their burst. Its prefill
// half: the burst's prompts with one output token each (the decode worker
// idles).
absl::StatusOr<double> PrefillAlone(std::shared_ptr<grpc::Channel> channel,
                                    const WorkerProfile& profile,
                                    const ProfileOptions& options, int requests,
                                    std::ostream& log) {
  auto alone = Run(std::move(channel), requests, options.neighbor_prompt, 1,
                   requests, 7001, options);
  if (!alone.ok()) return alone.status();
  int steps = 0;
  auto ratio = PrefillBurstRatio(*alone, profile, &steps);
  if (!ratio.ok()) return ratio.status();
  log << absl::StrFormat(
      "neighbours' baseline: %d prefill steps of the burst's prompts alone "
      "%.3fx the fit\n",
      steps, *ratio);
  return *ratio;
}

// Its decode half, by batch: the burst's own tail (the requests still
// decoding after its last first token), and for b from 1 to `batch`,
// b requests of the burst's prompts sent at once with answers b times the
// burst's, so that the first is still decoding when the last one's prompt
// is in (the prefill worker may take them one at a time): after that they
// decode with the prefill worker idle, at every batch from b down to 1.
absl::StatusOr<DecodeTimes> DecodeAlone(
    std::shared_ptr<grpc::Channel> channel, const WorkerProfile& profile,
    const ProfileOptions& options,
    const std::vector<bench::RequestRecord>& burst, int batch,
    std::ostream& log) {
  DecodeTimes times = DecodeAloneTimes(burst, profile);
  // 1, 2, 4, ... and `batch` itself: a batch between two of them counts
  // against the nearer (DecodeTimes::RatioAt), and a cluster whose burst
  // decodes dozens at once needs no dozens of runs.
  std::vector<int> sizes;
  for (int b = 1; b < batch; b *= 2) sizes.push_back(b);
  sizes.push_back(batch);
  for (int b : sizes) {
    auto run = Run(channel, b, options.neighbor_prompt,
                   options.neighbor_output * b, b, 7001 + b, options);
    if (!run.ok()) return run.status();
    times.Add(DecodeAloneTimes(*run, profile));
  }
  log << "neighbours' baseline: decoding alone, by batch:";
  for (const auto& [b, c] : times.by_batch) {
    log << absl::StrFormat(" %d: %.3fx (%d gaps);", b, c.ratio(), c.gaps);
  }
  log << "\n";
  return times;
}

// The decode fit's level: the decode samples' largest batch that fits the
// pool, run again (B requests of the first decode context and
// decode_tokens), its samples taken as the fit's were, against the fit.
absl::StatusOr<double> DecodeLevel(std::shared_ptr<grpc::Channel> channel,
                                   const WorkerProfile& profile,
                                   const ProfileOptions& options,
                                   std::ostream& log) {
  const int context = options.decode_contexts.front();
  const int tokens = options.decode_tokens;
  int batch = 1;
  for (int b : options.decode_batches) {
    if (int64_t{b} * (context + tokens) <=
        profile.kv_blocks * profile.block_size) {
      batch = std::max(batch, b);
    }
  }
  auto run =
      Run(std::move(channel), batch, context, tokens, batch, 7100, options);
  if (!run.ok()) return run.status();
  double measured = 0, predicted = 0;
  const std::vector<DecodeWindowSample> samples =
      DecodeWindowSamples(*run, std::max(1, options.decode_chunk_tokens));
  for (const DecodeWindowSample& s : samples) {
    measured += s.step_s;
    predicted += DecodeSeconds(profile, s.sum_context, s.batch);
  }
  const double level = predicted > 0 ? measured / predicted : 1;
  log << absl::StrFormat(
      "decode level: %zu stretches of %d requests decoding %.3fx the fit\n",
      samples.size(), batch, level);
  return level;
}

// The batch up to which a burst's decode gaps need a baseline: the largest
// batch with at least 5% of them.
int BaselineBatch(const DecodeTimes& burst) {
  int batch = 1;
  for (const auto& [b, c] : burst.by_batch) {
    if (20 * int64_t{c.gaps} >= burst.gaps()) {
      batch = std::max(batch, static_cast<int>(b));
    }
  }
  return batch;
}

// The neighbour run (profiler.h, neighbors.h): a burst of requests sent at
// once, and its baseline: the prefill half before it, the decode half from
// its tail and after it.
absl::StatusOr<NeighborEstimate> MeasureNeighbors(
    std::shared_ptr<grpc::Channel> channel, const WorkerProfile& profile,
    const ProfileOptions& options, std::ostream& log) {
  // Every request's KV reservation fits the decode worker's pool at once,
  // so the prefill worker never waits for room.
  const int64_t fit =
      profile.kv_blocks * profile.block_size /
      (options.neighbor_prompt + options.neighbor_output + profile.block_size);
  const int requests = static_cast<int>(
      std::min<int64_t>(options.neighbor_requests, std::max<int64_t>(fit, 1)));
  NeighborBaseline baseline;
  auto prefill = PrefillAlone(channel, profile, options, requests, log);
  if (!prefill.ok()) return prefill.status();
  baseline.prefill_ratio = *prefill;
  auto records = Run(channel, requests, options.neighbor_prompt,
                     options.neighbor_output, requests, 7000, options);
  if (!records.ok()) return records.status();
  auto burst = EstimateNeighborSlowdown(*records, profile, baseline);
  if (!burst.ok()) return burst.status();
  // The decode-alone runs' requests fit the pool at once too.
  int batch = BaselineBatch(burst->decode);
  while (batch > 1 && int64_t{batch} * (options.neighbor_prompt +
                                        options.neighbor_output * batch +
                                        profile.block_size) >
                          profile.kv_blocks * profile.block_size) {
    --batch;
  }
  auto decode = DecodeAlone(channel, profile, options, *records, batch, log);
  if (!decode.ok()) return decode.status();
  baseline.decode = *decode;
  auto estimate = EstimateNeighborSlowdown(*records, profile, baseline);
  if (!estimate.ok()) return estimate.status();
  auto level = DecodeLevel(channel, profile, options, log);
  if (!level.ok()) return level.status();
  estimate->decode_level = *level;
  log << "neighbours (" << requests << " requests of "
      << options.neighbor_prompt << " + " << options.neighbor_output
      << " tokens at once): " << estimate->Describe() << "\n";
  return estimate;
}

// The decode fit's error at each batch of its samples (decode_batch_factors
// in cost_profile.h): measured over fitted time of that batch's samples.
std::vector<WorkerProfile::BatchFactor> BatchFactors(
    const std::vector<Sample>& decode, const WorkerProfile& profile,
    std::ostream& log) {
  std::map<int64_t, std::pair<double, double>> by_batch;
  for (const Sample& s : decode) {
    auto& [measured, fitted] = by_batch[static_cast<int64_t>(s.x2)];
    measured += s.y;
    fitted += DecodeSeconds(profile, static_cast<int64_t>(s.x1),
                            static_cast<int64_t>(s.x2));
  }
  std::vector<WorkerProfile::BatchFactor> factors;
  log << "decode fit's error by batch:";
  for (const auto& [batch, sums] : by_batch) {
    if (sums.second <= 0) continue;
    factors.push_back({batch, sums.first / sums.second});
    log << absl::StrFormat(" %d: %.3fx;", batch, factors.back().factor);
  }
  WorkerProfile with = profile;
  with.decode_batch_factors = factors;
  double error = 0;
  for (const Sample& s : decode) {
    error += std::abs(DecodeSeconds(with, static_cast<int64_t>(s.x1),
                                    static_cast<int64_t>(s.x2)) -
                      s.y) /
             s.y;
  }
  log << absl::StrFormat(" the fit times them %.1f%% off its samples\n",
                         100 * error / static_cast<double>(decode.size()));
  return factors;
}

void LogFit(std::ostream& log, const std::string& what, const FitResult& f) {
  log << absl::StrFormat(
      "%s: c0 %.4g, c1 %.4g, c2 %.4g; %d samples, error %.1f%% (held out "
      "%.1f%%)\n",
      what, f.model.c0, f.model.c1, f.model.c2, f.samples, 100 * f.mape,
      100 * f.heldout_mape);
}

}  // namespace

DecodeWindow WholeBatchWindow(
    const std::vector<bench::RequestRecord>& records) {
  // Earlier steps share the engine with prefills of the others.
  DecodeWindow w{0, std::numeric_limits<double>::infinity()};
  for (const bench::RequestRecord& r : records) {
    const double first = 1e3 * r.send_time_s + r.ttft_ms;
    double last = first;
    for (double gap : r.itl_ms) last += gap;
    w.start_ms = std::max(w.start_ms, first);
    w.end_ms = std::min(w.end_ms, last);
  }
  return w;
}

std::vector<DecodeWindowSample> DecodeWindowSamples(
    const std::vector<bench::RequestRecord>& records, int chunk) {
  const auto [start, end] = WholeBatchWindow(records);
  // Gaps by the index of the step within that window, with each request's
  // context at it; a stretch of `chunk` steps gives one sample, the median
  // gap (robust to tokens that reach the client together).
  std::vector<std::vector<double>> gaps;
  std::vector<int64_t> contexts;
  for (const bench::RequestRecord& r : records) {
    double at = 1e3 * r.send_time_s + r.ttft_ms;
    int64_t context = r.prompt_tokens + 1;
    size_t step = 0;
    for (double gap : r.itl_ms) {
      if (at >= start && at + gap <= end) {
        if (gaps.size() <= step) {
          gaps.resize(step + 1);
          contexts.resize(step + 1);
        }
        gaps[step].push_back(gap);
        contexts[step] += context;
        ++step;
      }
      at += gap;
      ++context;
    }
  }
  std::vector<DecodeWindowSample> samples;
  const size_t batch = records.size();
  for (size_t first = 0; first + chunk <= gaps.size(); first += chunk) {
    std::vector<double> window;
    int64_t sum_context = 0;
    for (size_t s = first; s < first + chunk; ++s) {
      if (gaps[s].size() != batch) continue;
      window.insert(window.end(), gaps[s].begin(), gaps[s].end());
      sum_context += contexts[s] / static_cast<int64_t>(batch);
    }
    if (window.size() < static_cast<size_t>(chunk) * batch) continue;
    samples.push_back({static_cast<int64_t>(batch),
                       static_cast<int64_t>(batch) * sum_context / chunk,
                       Median(std::move(window)) / 1e3});
  }
  return samples;
}

absl::StatusOr<WorkerProfile> MeasureProfile(
    std::shared_ptr<grpc::Channel> channel, const ProfileOptions& options,
    std::ostream& log) {
  auto shape = ReadCluster(*channel);
  if (!shape.ok()) return shape.status();
  WorkerProfile profile;
  profile.name = options.name;
  profile.kv_blocks = shape->kv_blocks;
  profile.block_size = shape->block_size;
  profile.kv_bytes_per_token = shape->kv_bytes_per_token;
  profile.max_batch_tokens = options.max_batch_tokens;
  profile.max_num_seqs = options.max_num_seqs;
  const int64_t pool_tokens = shape->kv_blocks * shape->block_size;

  std::vector<Sample> prefill, decode, transfer;
  for (int len : options.prefill_lengths) {
    if (len + 1 > pool_tokens) continue;
    auto records = Run(channel, options.prefill_repeats, len, 1, 1,
                       static_cast<uint64_t>(len), options);
    if (!records.ok()) return records.status();
    for (const bench::RequestRecord& r : *records) {
      const double l = r.prompt_tokens;
      prefill.push_back({l, l * l, r.server.prefill_ms / 1e3});
      // A prompt longer than a step's token budget is prefilled in chunks,
      // and its KV streams during the last one only (every block, layer by
      // layer), while the simulator prefills a prompt in one step and times
      // its transfer from that step's start: those samples would fit a
      // different law.
      if (r.server.kv_transfer_bytes > 0 && r.server.kv_transfer_ms > 0 &&
          shape->kv_bytes_per_token > 0 &&
          r.prompt_tokens <= options.max_batch_tokens) {
        // In tokens (bytes / kv_bytes_per_token), so the square term stays
        // well within a double's precision.
        const double tokens = static_cast<double>(r.server.kv_transfer_bytes) /
                              static_cast<double>(shape->kv_bytes_per_token);
        transfer.push_back(
            {tokens, tokens * tokens, r.server.kv_transfer_ms / 1e3});
        log << "transfer " << r.server.kv_transfer_bytes
            << " bytes: " << r.server.kv_transfer_ms << " ms (prefill "
            << r.server.prefill_ms << " ms, exposed "
            << r.server.kv_transfer_exposed_ms << " ms)\n";
      }
    }
    log << "prefill " << len << " tokens: " << prefill.back().y * 1e3
        << " ms\n";
  }
  const int t = options.decode_tokens;
  const int chunk = std::max(1, options.decode_chunk_tokens);
  for (int context : options.decode_contexts) {
    for (int batch : options.decode_batches) {
      if (int64_t{batch} * (context + t) > pool_tokens) continue;
      auto records =
          Run(channel, batch, context, t, batch,
              static_cast<uint64_t>(1000 * batch + context), options);
      if (!records.ok()) return records.status();
      const int before = static_cast<int>(decode.size());
      for (const DecodeWindowSample& s : DecodeWindowSamples(*records, chunk)) {
        decode.push_back({static_cast<double>(s.sum_context),
                          static_cast<double>(s.batch), s.step_s});
        log << "decode batch " << s.batch << ", context " << s.sum_context
            << " in all: " << s.step_s * 1e3 << " ms per step\n";
      }
      if (static_cast<int>(decode.size()) == before) {
        log << "decode batch " << batch << ", prompt " << context
            << ": no stretch of " << chunk
            << " steps with the whole batch decoding (raise "
               "--profile_decode_tokens)\n";
      }
    }
  }

  auto prefill_fit = FitCostModel(prefill, "prefill", options.max_heldout_mape);
  if (!prefill_fit.ok()) return prefill_fit.status();
  LogFit(log, "prefill", *prefill_fit);
  profile.prefill = prefill_fit->model;
  auto decode_fit = FitCostModel(decode, "decode", options.max_heldout_mape);
  if (!decode_fit.ok()) return decode_fit.status();
  LogFit(log, "decode", *decode_fit);
  profile.decode = decode_fit->model;
  profile.decode_batch_factors = BatchFactors(decode, profile, log);
  if (shape->split) {
    auto transfer_fit =
        FitCostModel(transfer, "transfer", options.max_heldout_mape);
    if (!transfer_fit.ok()) return transfer_fit.status();
    LogFit(log, "transfer (x1 = tokens, x2 = tokens^2)", *transfer_fit);
    profile.transfer_alpha_s = transfer_fit->model.c0;
    profile.transfer_bytes_per_s =
        transfer_fit->model.c1 > 0
            ? static_cast<double>(shape->kv_bytes_per_token) /
                  transfer_fit->model.c1
            : std::numeric_limits<double>::max();
    profile.transfer_s_per_token2 = transfer_fit->model.c2;
    std::vector<NeighborEstimate> runs;
    for (int i = 0; i < std::max(1, options.neighbor_runs); ++i) {
      auto run = MeasureNeighbors(channel, profile, options, log);
      if (!run.ok()) return run.status();
      runs.push_back(*run);
    }
    const NeighborEstimate median = MedianNeighborEstimate(runs);
    if (runs.size() > 1) {
      log << "neighbours, the median of " << runs.size()
          << " runs: " << median.Describe() << "\n";
    }
    profile.neighbor_slowdown = median.slowdown;
    // The fits' shape comes from their samples (the decode fit's with its
    // error by batch), their level from steps timed last: the host's speed
    // moves by more than the fits' error in the minutes between. The
    // prefill's from the burst's prompts alone, the decode's from the
    // samples' largest batch again (against the fit with its factors:
    // the drift alone).
    for (double* c :
         {&profile.prefill.c0, &profile.prefill.c1, &profile.prefill.c2}) {
      *c *= median.prefill_alone;
    }
    for (double* c :
         {&profile.decode.c0, &profile.decode.c1, &profile.decode.c2}) {
      *c *= median.decode_level;
    }
    log << absl::StrFormat(
        "prefill fit scaled by %.3f, decode fit by %.3f (the baseline)\n",
        median.prefill_alone, median.decode_level);
    profile.source = absl::StrFormat(
        "measured by baton-bench profile on a split cluster: prefill "
        "held-out error %.1f%%, decode %.1f%%, transfer %.1f%%; prefill "
        "and decode fits scaled by %.3f and %.3f to the speed of the "
        "neighbour run's baseline",
        100 * prefill_fit->heldout_mape, 100 * decode_fit->heldout_mape,
        100 * transfer_fit->heldout_mape, median.prefill_alone,
        median.decode_level);
  } else {
    profile.transfer_alpha_s = 0;
    profile.transfer_bytes_per_s = 1e12;
    profile.source = absl::StrFormat(
        "measured by baton-bench profile on a colocated cluster (no KV "
        "transfer measured; the transfer fields are placeholders): prefill "
        "held-out error %.1f%%, decode %.1f%%",
        100 * prefill_fit->heldout_mape, 100 * decode_fit->heldout_mape);
  }
  return profile;
}

}  // namespace baton::sim
