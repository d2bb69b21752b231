// baton-bench: a load generator for a running Baton cluster, with the flags
// of `vllm bench serve` where the concept is the same (dashes or
// underscores). See bench/serving/bench.h.
//
//   baton-bench --server=HOST:PORT [--dataset-name=random|sharegpt] ...
//   baton-bench profile --server=HOST:PORT [--profile_out=FILE]
//               [--profile_name=TEXT]   (a cost profile for baton-sim)
//   baton-bench plan --profile=FILE --workers=N --goodput="ttft:MS tpot:MS"
//               [workload flags or --trace=CSV]   (the best P:D split)
//
// Exit status: 0 every request completed; 1 none did, or the server could
// not be used (also a flag value absl cannot parse, e.g. --request-rate=x);
// 2 an invalid option or dataset; 3 some requests failed, were cancelled at
// the time limit or interrupt, or never sent (the results are still saved).
// SIGINT / SIGTERM stop the run as the time limit does.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/serving/bench.h"
#include "bench/serving/report.h"
#include "bench/serving/runner.h"
#include "bench/sim/planner.h"
#include "bench/sim/profiler.h"
#include "bench/sim/workload.h"
#include "common/auth/bearer_interceptor.h"
#include "common/auth/client_flags.h"

ABSL_FLAG(std::string, server, "", "HOST:PORT of a baton-coordinator");
ABSL_FLAG(std::string, model, "",
          "model id as the server lists it; empty = the only one served");
ABSL_FLAG(std::string, dataset_name, "random",
          "random, sharegpt or multiturn (conversations resending their "
          "history every turn: the prefix cache's workload)");
ABSL_FLAG(int32_t, multiturn_conversations, 32, "multiturn: conversations");
ABSL_FLAG(int32_t, multiturn_turns, 8, "multiturn: turns per conversation");
ABSL_FLAG(int32_t, multiturn_system_len, 512,
          "multiturn: tokens of the system prompt all conversations share");
ABSL_FLAG(int32_t, multiturn_user_len, 64,
          "multiturn: tokens of each user message (answers are "
          "--random-output-len tokens)");
ABSL_FLAG(std::string, dataset_path, "",
          "sharegpt: the JSON file (a list of {\"conversations\": [...]})");
ABSL_FLAG(int32_t, num_prompts, 1000, "requests to send");
ABSL_FLAG(int32_t, random_input_len, 1024, "random: mean prompt tokens");
ABSL_FLAG(int32_t, random_output_len, 128, "random: mean output tokens");
ABSL_FLAG(int32_t, random_prefix_len, 0,
          "random: tokens of a prefix every prompt starts with (shared-prefix "
          "workload; the prompt is this plus --random-input-len)");
ABSL_FLAG(double, random_range_ratio, 0.0,
          "random: in [0, 1); lengths uniform in [len*(1-r), len*(1+r)]");
ABSL_FLAG(std::string, vocab_range, "1000:40000",
          "random: prompt token ids are uniform in [BEGIN, END)");
ABSL_FLAG(int32_t, sharegpt_output_len, 0,
          "sharegpt: output tokens of every request; 0 = the reply's length");
ABSL_FLAG(double, request_rate, std::numeric_limits<double>::infinity(),
          "requests/s (Poisson, or gamma with --burstiness); inf = all at "
          "once");
ABSL_FLAG(double, burstiness, 1.0,
          "gamma shape of the gaps between requests; 1 = Poisson, < 1 "
          "burstier");
ABSL_FLAG(int32_t, max_concurrency, 0,
          "most requests in flight; 0 = unbounded");
ABSL_FLAG(int64_t, seed, 0, "seeds the prompts, the arrivals and sampling");
ABSL_FLAG(double, temperature, 0.0, "sampling temperature; 0 = greedy");
ABSL_FLAG(bool, ignore_eos, true,
          "generate exactly the requested output lengths");
ABSL_FLAG(std::string, goodput, "",
          "SLOs in ms, e.g. \"ttft:500 tpot:50 e2el:2000\" (or comma "
          "separated); goodput counts requests meeting all of them");
ABSL_FLAG(std::string, metric_percentiles, "",
          "percentiles reported besides median, p90 and p99, e.g. 95,99.9");
ABSL_FLAG(bool, save_result, false, "save the results as JSON");
ABSL_FLAG(std::string, result_dir, ".", "folder of the JSON result");
ABSL_FLAG(std::string, result_filename, "",
          "name of the JSON result; empty = baton-bench-DATASET-RATEqps-cN-"
          "DATE.json");
ABSL_FLAG(double, request_timeout_s, 600, "deadline of every request");
ABSL_FLAG(double, max_duration_s, 0,
          "wall-clock limit of the run; then requests in flight are "
          "cancelled; 0 = none");
ABSL_FLAG(double, connect_timeout_s, 10, "wait this long for the server");
ABSL_FLAG(bool, progress, false,
          "show the progress bar on stderr even when it is not a terminal");
ABSL_FLAG(std::string, profile, "",
          "plan: the workers' cost profile (JSON; baton-bench profile)");
ABSL_FLAG(int32_t, workers, 2, "plan: the worker budget to split");
ABSL_FLAG(std::string, plan_json, "",
          "plan: also write every shape's predicted figures to this JSON "
          "file");
ABSL_FLAG(std::string, trace, "",
          "plan: a CSV trace instead of random arrivals (bench/sim/"
          "workload.h)");
ABSL_FLAG(std::string, profile_out, "profile.json",
          "profile: where the fitted cost profile goes (baton-sim --profile)");
ABSL_FLAG(std::string, profile_name, "",
          "profile: what was measured (model, hardware, threads)");
ABSL_FLAG(int, profile_decode_tokens, 384,
          "profile: output tokens of each decode run (longer: more samples "
          "and longer contexts)");
ABSL_FLAG(int, profile_neighbor_runs, 3,
          "profile: neighbour runs (each after its own baseline) whose "
          "median slowdowns and baseline the profile keeps");
ABSL_FLAG(bool, profile_quick, false,
          "profile: fewer points (prompts up to 512 tokens, decode batches "
          "up to 8 with 256-token answers, a neighbour run of 16 "
          "requests), for a quick check rather than a profile to keep");
ABSL_FLAG(double, profile_max_error, 0.10,
          "profile: refuse a fit whose mean error on held-out samples is "
          "above this fraction (a noisy host gives a profile not worth "
          "keeping)");
ABSL_FLAG(bool, reset_prefix_cache, false,
          "drop every cached prefix in the cluster before the run "
          "(Baton.ResetPrefixCache, an admin call): a run that resends an "
          "earlier run's prompts then measures them cold");
ABSL_FLAG(std::string, cpus, "",
          "pin the benchmark client to these CPUs, e.g. 3 or 2-3");

namespace {

std::atomic<bool> g_interrupted{false};

void OnSignal(int) { g_interrupted.store(true); }

// "--request-rate=5" -> "--request_rate=5": flag names accept dashes.
std::vector<std::string> NormalizeFlagNames(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& a = args[i];
    if (a == "--") break;
    if (!absl::StartsWith(a, "--")) continue;
    const size_t end = std::min(a.find('='), a.size());
    for (size_t j = 2; j < end; ++j) {
      if (a[j] == '-') a[j] = '_';
    }
  }
  return args;
}

int Fail(const absl::Status& status) {
  std::cerr << "baton-bench: " << status.message() << "\n";
  const bool bad_input = status.code() == absl::StatusCode::kInvalidArgument ||
                         status.code() == absl::StatusCode::kNotFound;
  return bad_input ? 2 : 1;
}

// `baton-bench profile`: measures the cluster at --server and writes the
// cost profile baton-sim reads (bench/sim/profiler.h).
int Profile() {
  baton::sim::ProfileOptions options;
  options.name = absl::GetFlag(FLAGS_profile_name);
  options.request_timeout_s = absl::GetFlag(FLAGS_request_timeout_s);
  options.decode_tokens = absl::GetFlag(FLAGS_profile_decode_tokens);
  options.neighbor_runs = absl::GetFlag(FLAGS_profile_neighbor_runs);
  if (options.neighbor_runs < 1) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--profile_neighbor_runs must be at least 1, got ",
                     options.neighbor_runs)));
  }
  if (absl::GetFlag(FLAGS_profile_quick)) {
    options.prefill_lengths = {32, 64, 128, 256, 512};
    options.decode_batches = {1, 2, 4, 8};
    options.decode_tokens = std::min(options.decode_tokens, 256);
    options.neighbor_requests = 16;
    options.neighbor_runs = 1;
  }
  options.max_heldout_mape = absl::GetFlag(FLAGS_profile_max_error);
  if (!(options.max_heldout_mape > 0)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--profile_max_error must be a positive fraction, got ",
                     options.max_heldout_mape)));
  }
  if (options.decode_tokens < 2 * options.decode_chunk_tokens) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--profile_decode_tokens must be at least ",
        2 * options.decode_chunk_tokens, ", got ", options.decode_tokens)));
  }
  auto channel = baton::OpenChannel(absl::GetFlag(FLAGS_server),
                                    baton::ClientSecurityFromFlags());
  if (!channel.ok()) return Fail(channel.status());
  if (absl::Status s = baton::bench::WaitForServer(
          **channel, absl::GetFlag(FLAGS_server),
          absl::Seconds(absl::GetFlag(FLAGS_connect_timeout_s)));
      !s.ok()) {
    return Fail(s);
  }
  auto profile = baton::sim::MeasureProfile(*channel, options, std::cerr);
  if (!profile.ok()) return Fail(profile.status());
  const std::string out = absl::GetFlag(FLAGS_profile_out);
  if (absl::Status s =
          baton::bench::WriteJsonFile(baton::ProfileJson(*profile), out);
      !s.ok()) {
    return Fail(s);
  }
  std::cout << "profile written to " << out << "\n";
  return 0;
}

// `baton-bench plan`: simulates every split of --workers for the workload
// and the SLOs, and recommends the one with the best goodput
// (bench/sim/planner.h).
int Plan(const std::string& slo_spec) {
  if (absl::GetFlag(FLAGS_profile).empty()) {
    return Fail(absl::InvalidArgumentError(
        "plan: --profile=FILE is required (a cost profile, e.g. from "
        "baton-bench profile)"));
  }
  auto profile = baton::LoadProfile(absl::GetFlag(FLAGS_profile));
  if (!profile.ok()) return Fail(profile.status());
  auto slo = baton::bench::ParseSlo(slo_spec);
  if (!slo.ok()) return Fail(slo.status());
  baton::sim::WorkloadOptions workload;
  workload.trace = absl::GetFlag(FLAGS_trace);
  workload.num_prompts = absl::GetFlag(FLAGS_num_prompts);
  workload.request_rate = absl::GetFlag(FLAGS_request_rate);
  workload.burstiness = absl::GetFlag(FLAGS_burstiness);
  workload.input_len = absl::GetFlag(FLAGS_random_input_len);
  workload.output_len = absl::GetFlag(FLAGS_random_output_len);
  workload.range_ratio = absl::GetFlag(FLAGS_random_range_ratio);
  workload.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  auto requests = baton::sim::MakeWorkload(workload);
  if (!requests.ok()) return Fail(requests.status());
  baton::sim::PlanOptions options;
  options.workers = absl::GetFlag(FLAGS_workers);
  options.base.profile = *profile;
  options.requests = *std::move(requests);
  options.slo = *slo;
  auto plan = baton::sim::MakePlan(options);
  if (!plan.ok()) return Fail(plan.status());
  std::cout << "workload: " << options.requests.size()
            << " requests; profile: " << profile->name << "\n"
            << baton::sim::FormatPlan(*plan, *slo);
  if (const std::string out = absl::GetFlag(FLAGS_plan_json); !out.empty()) {
    auto rows = [](const std::vector<baton::sim::PlanRow>& in) {
      nlohmann::json list = nlohmann::json::array();
      for (const baton::sim::PlanRow& r : in) {
        list.push_back({{"shape", r.shape},
                        {"goodput", r.goodput},
                        {"slo_attainment", r.attainment},
                        {"request_throughput", r.throughput},
                        {"ttft_p90_ms", r.ttft_p90_ms},
                        {"tpot_p90_ms", r.tpot_p90_ms}});
      }
      return list;
    };
    const nlohmann::json json = {
        {"recommended", plan->rows.empty() ? "" : plan->rows[0].shape},
        {"profile", profile->name},
        {"requests", options.requests.size()},
        {"shapes", rows(plan->rows)},
        {"at_80_percent", rows(plan->at_80_percent)},
        {"at_120_percent", rows(plan->at_120_percent)}};
    if (absl::Status s = baton::bench::WriteJsonFile(json, out); !s.ok()) {
      return Fail(s);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "baton-bench --server=HOST:PORT [flags]: load-tests a Baton cluster and "
      "reports TTFT, TPOT, ITL, E2EL, throughput and goodput. Flag names "
      "take dashes or underscores (--request-rate = --request_rate).");
  std::vector<std::string> args = NormalizeFlagNames(argc, argv);
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  const std::vector<char*> positional = absl::ParseCommandLine(
      static_cast<int>(arg_ptrs.size()), arg_ptrs.data());

  if (positional.size() > 1 && std::string(positional[1]) == "profile") {
    return Profile();
  }
  if (positional.size() > 1 && std::string(positional[1]) == "plan") {
    std::string slo = absl::GetFlag(FLAGS_goodput);
    for (size_t i = 2; i < positional.size(); ++i) {
      absl::StrAppend(&slo, " ", positional[i]);
    }
    return Plan(slo);
  }
  baton::bench::BenchOptions o;
  o.goodput = absl::GetFlag(FLAGS_goodput);
  // "--goodput ttft:500 tpot:50": the SLOs after the first are positional.
  for (size_t i = 1; i < positional.size(); ++i) {
    const std::string arg = positional[i];
    if (arg.find(':') == std::string::npos) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "unexpected argument '", arg, "' (flags look like --name=value)")));
    }
    absl::StrAppend(&o.goodput, " ", arg);
  }
  o.server = absl::GetFlag(FLAGS_server);
  o.security = baton::ClientSecurityFromFlags();
  o.dataset_name = absl::GetFlag(FLAGS_dataset_name);
  o.random.num_prompts = absl::GetFlag(FLAGS_num_prompts);
  o.random.input_len = absl::GetFlag(FLAGS_random_input_len);
  o.random.prefix_len = absl::GetFlag(FLAGS_random_prefix_len);
  o.random.output_len = absl::GetFlag(FLAGS_random_output_len);
  o.random.range_ratio = absl::GetFlag(FLAGS_random_range_ratio);
  const std::pair<std::string, std::string> vocab =
      absl::StrSplit(absl::GetFlag(FLAGS_vocab_range), absl::MaxSplits(':', 1));
  if (!absl::SimpleAtoi(vocab.first, &o.random.vocab_begin) ||
      !absl::SimpleAtoi(vocab.second, &o.random.vocab_end)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--vocab-range must be BEGIN:END, got '",
                     absl::GetFlag(FLAGS_vocab_range), "'")));
  }
  o.multiturn.conversations = absl::GetFlag(FLAGS_multiturn_conversations);
  o.multiturn.turns = absl::GetFlag(FLAGS_multiturn_turns);
  o.multiturn.system_len = absl::GetFlag(FLAGS_multiturn_system_len);
  o.multiturn.user_len = absl::GetFlag(FLAGS_multiturn_user_len);
  o.sharegpt.path = absl::GetFlag(FLAGS_dataset_path);
  o.sharegpt.output_len = absl::GetFlag(FLAGS_sharegpt_output_len);
  o.runner.model = absl::GetFlag(FLAGS_model);
  o.runner.arrivals.request_rate = absl::GetFlag(FLAGS_request_rate);
  o.runner.arrivals.burstiness = absl::GetFlag(FLAGS_burstiness);
  o.runner.max_concurrency = absl::GetFlag(FLAGS_max_concurrency);
  o.runner.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  o.runner.temperature = absl::GetFlag(FLAGS_temperature);
  o.runner.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  o.runner.request_timeout_s = absl::GetFlag(FLAGS_request_timeout_s);
  o.runner.max_duration_s = absl::GetFlag(FLAGS_max_duration_s);
  o.runner.interrupted = &g_interrupted;
  if (absl::GetFlag(FLAGS_progress) || isatty(STDERR_FILENO)) {
    o.runner.progress = &std::cerr;
  }
  o.metric_percentiles = absl::GetFlag(FLAGS_metric_percentiles);
  o.save_result = absl::GetFlag(FLAGS_save_result);
  o.result_dir = absl::GetFlag(FLAGS_result_dir);
  o.result_filename = absl::GetFlag(FLAGS_result_filename);
  o.connect_timeout_s = absl::GetFlag(FLAGS_connect_timeout_s);
  o.cpus = absl::GetFlag(FLAGS_cpus);
  o.reset_prefix_cache = absl::GetFlag(FLAGS_reset_prefix_cache);

  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  absl::StatusOr<baton::bench::BenchOutcome> outcome =
      baton::bench::RunBench(o, std::cout, std::cerr);
  if (!outcome.ok()) return Fail(outcome.status());
  const std::string problem = baton::bench::OutcomeProblem(*outcome);
  if (!problem.empty()) std::cerr << "baton-bench: " << problem << "\n";
  return baton::bench::OutcomeExitCode(*outcome);
}
