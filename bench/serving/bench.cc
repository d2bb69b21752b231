#include "bench/serving/bench.h"

#include <sched.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "baton/v1/api.grpc.pb.h"
#include "bench/serving/report.h"
#include "common/status_macros.h"

namespace baton::bench {
namespace {

using Json = nlohmann::json;

constexpr auto kRpcTimeout = std::chrono::seconds(30);

absl::Status FromGrpc(const grpc::Status& status, absl::string_view what) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, ": ", status.error_message()));
}

// Counts tokens with the server's Tokenize RPC.
class GrpcTokenCounter final : public TokenCounter {
 public:
  GrpcTokenCounter(v1::Baton::Stub* stub, std::string model)
      : stub_(stub), model_(std::move(model)) {}

  absl::StatusOr<int> CountText(absl::string_view text) override {
    v1::TokenizeRequest request;
    request.set_model(model_);
    request.set_text(std::string(text));
    return Count(request);
  }
  absl::StatusOr<int> CountChat(absl::string_view user_text) override {
    v1::TokenizeRequest request;
    request.set_model(model_);
    v1::ChatMessage* m = request.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(std::string(user_text));
    return Count(request);
  }

 private:
  absl::StatusOr<int> Count(const v1::TokenizeRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kRpcTimeout);
    v1::TokenizeResponse response;
    const grpc::Status status = stub_->Tokenize(&context, request, &response);
    if (!status.ok()) return FromGrpc(status, "Tokenize (for the dataset)");
    return response.token_ids_size();
  }

  v1::Baton::Stub* const stub_;
  const std::string model_;
};

// The model to name in requests, checked against ListModels.
absl::StatusOr<v1::ModelInfo> ChooseModel(v1::Baton::Stub& stub,
                                          const std::string& wanted) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kRpcTimeout);
  v1::ListModelsResponse response;
  const grpc::Status status =
      stub.ListModels(&context, v1::ListModelsRequest(), &response);
  if (!status.ok()) return FromGrpc(status, "ListModels");
  std::vector<std::string> ids;
  for (const v1::ModelInfo& m : response.models()) {
    if (m.id() == wanted) return m;
    ids.push_back(m.id());
  }
  if (ids.empty()) {
    return absl::UnavailableError(
        "the server lists no model (no healthy worker registered?)");
  }
  if (wanted.empty() && ids.size() == 1) return response.models(0);
  if (wanted.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model: the server serves several models (",
                     absl::StrJoin(ids, ", "), "); name one"));
  }
  return absl::NotFoundError(absl::StrCat("--model: '", wanted,
                                          "' is not served; the server has ",
                                          absl::StrJoin(ids, ", ")));
}

// Baton.ResetPrefixCache: every worker forgets its cached prefixes, so a run
// does not find the prompts of an earlier run on the same cluster.
absl::Status ResetPrefixCache(v1::Baton::Stub& stub, std::ostream& err) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kRpcTimeout);
  v1::ResetPrefixCacheResponse response;
  const grpc::Status status =
      stub.ResetPrefixCache(&context, v1::ResetPrefixCacheRequest(), &response);
  if (!status.ok()) {
    return FromGrpc(status, "--reset_prefix_cache: ResetPrefixCache");
  }
  if (response.failed_workers_size() > 0) {
    return absl::UnavailableError(
        absl::StrCat("--reset_prefix_cache: the reset did not reach ",
                     absl::StrJoin(response.failed_workers(), "; ")));
  }
  err << "prefix caches reset: " << response.workers_reset() << " workers, "
      << response.blocks_dropped() << " cached blocks dropped\n";
  return absl::OkStatus();
}

std::string RateName(double rate) {
  return std::isinf(rate) ? "inf" : absl::StrCat(rate);
}

Json ConfigJson(const BenchOptions& o, const std::string& model) {
  const RunnerOptions& r = o.runner;
  Json j = {{"date", absl::FormatTime(absl::RFC3339_sec, absl::Now(),
                                      absl::LocalTimeZone())},
            {"server", o.server},
            {"model", model},
            {"dataset_name", o.dataset_name},
            {"num_prompts", o.random.num_prompts},
            {"request_rate", RateName(r.arrivals.request_rate)},
            {"burstiness", r.arrivals.burstiness},
            {"max_concurrency", r.max_concurrency},
            {"request_timeout_s", r.request_timeout_s},
            {"max_duration_s", r.max_duration_s},
            {"seed", r.seed},
            {"temperature", r.temperature},
            {"ignore_eos", r.ignore_eos},
            {"cpus", o.cpus},
            {"reset_prefix_cache", o.reset_prefix_cache}};
  if (o.dataset_name == "random") {
    j["random_input_len"] = o.random.input_len;
    j["random_prefix_len"] = o.random.prefix_len;
    j["random_output_len"] = o.random.output_len;
    j["random_range_ratio"] = o.random.range_ratio;
    j["vocab_range"] = {o.random.vocab_begin, o.random.vocab_end};
  } else {
    j["dataset_path"] = o.sharegpt.path;
    j["sharegpt_output_len"] = o.sharegpt.output_len;
  }
  return j;
}

std::string DefaultFilename(const BenchOptions& o) {
  return absl::StrCat(
      "baton-bench-", o.dataset_name, "-",
      RateName(o.runner.arrivals.request_rate), "qps-c",
      o.runner.max_concurrency, "-",
      absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone()),
      ".json");
}

}  // namespace

static MultiTurnOptions MultiTurnFrom(const BenchOptions& o) {
  MultiTurnOptions m = o.multiturn;
  m.output_len = o.random.output_len;
  m.vocab_begin = o.random.vocab_begin;
  m.vocab_end = o.random.vocab_end;
  m.max_concurrency = o.runner.max_concurrency;
  m.seed = o.runner.seed;
  m.model = o.runner.model;
  m.request_timeout_s = o.runner.request_timeout_s;
  m.interrupted = o.runner.interrupted;
  return m;
}

absl::Status ValidateBenchOptions(const BenchOptions& o) {
  if (o.server.empty()) {
    return absl::InvalidArgumentError("--server: HOST:PORT is required");
  }
  if (o.dataset_name == "random") {
    BATON_RETURN_IF_ERROR(ValidateRandomDatasetOptions(o.random));
  } else if (o.dataset_name == "sharegpt") {
    if (o.sharegpt.path.empty()) {
      return absl::InvalidArgumentError(
          "--dataset-path is required with --dataset-name=sharegpt");
    }
    if (o.random.num_prompts < 1 || o.sharegpt.output_len < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--num-prompts must be >= 1 and --sharegpt-output-len >= 0, got ",
          o.random.num_prompts, " and ", o.sharegpt.output_len));
    }
  } else if (o.dataset_name == "multiturn") {
    BATON_RETURN_IF_ERROR(ValidateMultiTurnOptions(MultiTurnFrom(o)));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dataset-name must be random, sharegpt or multiturn, got '",
        o.dataset_name, "'"));
  }
  BATON_RETURN_IF_ERROR(ValidateRunnerOptions(o.runner));
  BATON_RETURN_IF_ERROR(ParseSlo(o.goodput).status());
  BATON_RETURN_IF_ERROR(ParsePercentiles(o.metric_percentiles).status());
  if (!(o.connect_timeout_s > 0) || !std::isfinite(o.connect_timeout_s)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--connect-timeout-s must be > 0, got ", o.connect_timeout_s));
  }
  if (o.save_result) {
    struct stat st {};
    if (stat(o.result_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--result-dir: '", o.result_dir, "' is not an existing folder"));
    }
  }
  return absl::OkStatus();
}

absl::Status PinToCpus(const std::string& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (absl::string_view part : absl::StrSplit(cpus, ',')) {
    const std::pair<absl::string_view, absl::string_view> range =
        absl::StrSplit(part, absl::MaxSplits('-', 1));
    int first = 0, last = 0;
    const bool ok =
        absl::SimpleAtoi(range.first, &first) &&
        absl::SimpleAtoi(range.second.empty() ? range.first : range.second,
                         &last);
    if (!ok || first < 0 || last < first || last >= CPU_SETSIZE) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--cpus: '", part, "' is not a CPU number or range like 2-3"));
    }
    for (int cpu = first; cpu <= last; ++cpu) CPU_SET(cpu, &set);
  }
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cpus: cannot pin to '", cpus, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<BenchOutcome> RunMultiTurnBench(const BenchOptions& options,
                                               v1::Baton::Stub& stub,
                                               const v1::ModelInfo& model,
                                               std::ostream& out,
                                               std::ostream& err) {
  MultiTurnOptions m = MultiTurnFrom(options);
  m.model = model.id();
  if (model.vocab_size() > 0 && m.vocab_end > model.vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--vocab-range: end ", m.vocab_end, " exceeds the vocabulary of '",
        model.id(), "' (", model.vocab_size(), " tokens)"));
  }
  const MultiTurnRun run = RunMultiTurn(stub, m);
  const nlohmann::json summary = MultiTurnSummary(run);
  out << FormatMultiTurnSummary(summary) << std::flush;
  BenchOutcome outcome;
  outcome.metrics.num_requests = m.conversations * m.turns;
  outcome.metrics.completed = summary["turns_ok"].get<int>();
  outcome.metrics.failed = summary["turns_failed"].get<int>();
  outcome.metrics.not_sent = outcome.metrics.num_requests -
                             outcome.metrics.completed - outcome.metrics.failed;
  outcome.run.interrupted = run.interrupted;
  for (const TurnRecord& r : run.turns) {
    if (!r.ok) ++outcome.metrics.errors_by_code[r.error.substr(0, 40)];
  }
  outcome.config = {{"server", options.server},
                    {"model", model.id()},
                    {"dataset_name", "multiturn"},
                    {"conversations", m.conversations},
                    {"turns", m.turns},
                    {"system_len", m.system_len},
                    {"user_len", m.user_len},
                    {"output_len", m.output_len},
                    {"max_concurrency", m.max_concurrency},
                    {"seed", m.seed}};
  if (options.save_result) {
    const std::string name = options.result_filename.empty()
                                 ? std::string("baton-bench-multiturn.json")
                                 : options.result_filename;
    outcome.result_path = absl::StrCat(options.result_dir, "/", name);
    nlohmann::json turns = nlohmann::json::array();
    for (const TurnRecord& r : run.turns) {
      turns.push_back({{"conversation", r.conversation},
                       {"turn", r.turn},
                       {"ok", r.ok},
                       {"error", r.error},
                       {"ttft_ms", r.ttft_ms},
                       {"e2e_ms", r.e2e_ms},
                       {"prompt_tokens", r.prompt_tokens},
                       {"cached_tokens", r.cached_tokens},
                       {"completion_tokens", r.completion_tokens},
                       {"kv_transfer_bytes", r.kv_transfer_bytes},
                       {"prefill_worker", r.prefill_worker}});
    }
    BATON_RETURN_IF_ERROR(WriteJsonFile(
        {{"config", outcome.config}, {"summary", summary}, {"turns", turns}},
        outcome.result_path));
    err << "results saved to " << outcome.result_path << "\n";
  }
  return outcome;
}

}  // namespace

absl::StatusOr<BenchOutcome> RunBench(const BenchOptions& options,
                                      std::ostream& out, std::ostream& err) {
  BATON_RETURN_IF_ERROR(ValidateBenchOptions(options));
  BATON_ASSIGN_OR_RETURN(const SloSpec slo, ParseSlo(options.goodput));
  BATON_ASSIGN_OR_RETURN(const std::vector<double> extra,
                         ParsePercentiles(options.metric_percentiles));
  std::vector<double> percentiles = {90, 99};
  for (double p : extra) {
    if (p != 90 && p != 99 && p != 50) percentiles.push_back(p);
  }
  std::sort(percentiles.begin(), percentiles.end());
  if (!options.cpus.empty()) BATON_RETURN_IF_ERROR(PinToCpus(options.cpus));

  BATON_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                         OpenChannel(options.server, options.security));
  BATON_RETURN_IF_ERROR(WaitForServer(
      *channel, options.server, absl::Seconds(options.connect_timeout_s)));
  auto stub = v1::Baton::NewStub(channel);
  BATON_ASSIGN_OR_RETURN(const v1::ModelInfo model,
                         ChooseModel(*stub, options.runner.model));
  if (options.reset_prefix_cache) {
    BATON_RETURN_IF_ERROR(ResetPrefixCache(*stub, err));
  }

  if (options.dataset_name == "multiturn") {
    return RunMultiTurnBench(options, *stub, model, out, err);
  }
  std::vector<BenchPrompt> prompts;
  if (options.dataset_name == "random") {
    if (model.vocab_size() > 0 &&
        options.random.vocab_end > model.vocab_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--vocab-range: end ", options.random.vocab_end,
                       " exceeds the vocabulary of '", model.id(), "' (",
                       model.vocab_size(), " tokens)"));
    }
    BATON_ASSIGN_OR_RETURN(
        prompts, SampleRandomPrompts(options.random, options.runner.seed));
  } else {
    ShareGptOptions sharegpt = options.sharegpt;
    sharegpt.num_prompts = options.random.num_prompts;
    GrpcTokenCounter counter(stub.get(), model.id());
    BATON_ASSIGN_OR_RETURN(
        ShareGptSample sample,
        SampleShareGpt(sharegpt, counter, options.runner.seed));
    err << "sharegpt: " << sample.entries_total << " entries, "
        << sample.entries_malformed << " malformed, " << sample.entries_filtered
        << " outside the length bounds skipped, " << sample.prompts_repeated
        << " prompts repeated\n";
    prompts = std::move(sample.prompts);
  }

  BenchOutcome outcome;
  RunnerOptions runner = options.runner;
  runner.model = model.id();
  BATON_ASSIGN_OR_RETURN(outcome.run, RunWorkload(channel, prompts, runner));
  outcome.metrics = ComputeMetrics(outcome.run.records, slo, percentiles);
  out << FormatSummary(outcome.metrics, outcome.run, slo) << std::flush;
  outcome.config = ConfigJson(options, model.id());
  if (options.save_result) {
    const std::string name = options.result_filename.empty()
                                 ? DefaultFilename(options)
                                 : options.result_filename;
    outcome.result_path = absl::StrCat(options.result_dir, "/", name);
    BATON_RETURN_IF_ERROR(WriteJsonFile(
        ResultJson(outcome.metrics, outcome.run, slo, outcome.config),
        outcome.result_path));
    err << "results saved to " << outcome.result_path << "\n";
  }
  return outcome;
}

std::string OutcomeProblem(const BenchOutcome& outcome) {
  const BenchMetrics& m = outcome.metrics;
  if (m.completed == m.num_requests) return "";
  std::vector<std::string> codes;
  for (const auto& [code, count] : m.errors_by_code) {
    codes.push_back(absl::StrCat(code, ": ", count));
  }
  std::string line = absl::StrCat(m.num_requests - m.completed, " of ",
                                  m.num_requests, " requests did not complete");
  if (m.failed > 0) {
    absl::StrAppend(&line, "; ", m.failed, " failed (",
                    absl::StrJoin(codes, ", "), ")");
  }
  if (m.aborted + m.not_sent > 0) {
    absl::StrAppend(&line, "; ", m.aborted, " cancelled and ", m.not_sent,
                    " never sent at the ",
                    outcome.run.interrupted ? "interrupt" : "time limit");
  }
  return line;
}

int OutcomeExitCode(const BenchOutcome& outcome) {
  const BenchMetrics& m = outcome.metrics;
  if (m.completed == m.num_requests) return 0;
  return m.completed == 0 ? 1 : 3;
}

}  // namespace baton::bench
