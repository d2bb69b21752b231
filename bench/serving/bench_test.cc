// RunBench end to end against the stub server, and the baton-bench binary's
// exit codes and messages for bad input.
#include "bench/serving/bench.h"

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "bench/serving/stub_server.h"
#include "common/test_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace baton::bench {
namespace {

using Json = nlohmann::json;

struct Command {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Runs baton-bench with `flags`.
Command RunBinary(const std::string& flags) {
  const std::string command =
      absl::StrCat(BATON_BENCH_BINARY, " ", flags, " 2>&1");
  Command c;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return c;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    c.output.append(buffer, n);
  }
  const int status = pclose(pipe);
  c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return c;
}

Json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return Json::parse(in, nullptr, /*allow_exceptions=*/false);
}

// The requests of a saved result that meet `slo`, by their recorded
// latencies.
int CountMeetingSlo(const Json& result, const SloSpec& slo) {
  int good = 0;
  for (const Json& r : result["requests"]) {
    good += r["success"].get<bool>() &&
            (!slo.ttft_ms || r["ttft_ms"].get<double>() <= *slo.ttft_ms) &&
            (!slo.tpot_ms || r["tpot_ms"].is_null() ||
             r["tpot_ms"].get<double>() <= *slo.tpot_ms) &&
            (!slo.e2el_ms || r["e2el_ms"].get<double>() <= *slo.e2el_ms);
  }
  return good;
}

std::string SamplePath() {
  return baton::testing::SourceDir() +
         "/bench/serving/testdata/sharegpt_sample.json";
}

std::unique_ptr<StubServer> FastStub(
    grpc::StatusCode fail_code = grpc::StatusCode::OK, int fail_every = 0) {
  StubServerOptions options;
  options.first_token_delay_ms = 5;
  options.token_delay_ms = 1;
  options.fail_code = fail_code;
  options.fail_every = fail_every;
  auto server = StubServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

TEST(BenchRunTest, ShareGptRunPrintsAndSavesEveryRequest) {
  auto server = FastStub();
  ASSERT_NE(server, nullptr);
  BenchOptions o;
  o.server = server->address();
  o.dataset_name = "sharegpt";
  o.sharegpt.path = SamplePath();
  o.random.num_prompts = 6;
  o.runner.arrivals.request_rate = 200;
  o.goodput = "ttft:1000 e2el:5000";
  o.metric_percentiles = "95";
  o.save_result = true;
  o.result_dir = ::testing::TempDir();
  o.result_filename = "sharegpt-run.json";
  std::ostringstream out, err;
  auto outcome = RunBench(o, out, err);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(OutcomeExitCode(*outcome), 0);
  EXPECT_EQ(OutcomeProblem(*outcome), "");
  EXPECT_NE(out.str().find("Successful requests:"), std::string::npos);
  EXPECT_NE(out.str().find("P95 TTFT (ms):"), std::string::npos);
  EXPECT_NE(out.str().find("Request goodput (req/s):"), std::string::npos);
  EXPECT_NE(err.str().find("sharegpt: 24 entries"), std::string::npos)
      << err.str();

  const Json j = ReadJson(outcome->result_path);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["completed"], 6);
  EXPECT_EQ(j["good_requests"], CountMeetingSlo(j, *ParseSlo(o.goodput)));
  EXPECT_EQ(j["config"]["dataset_name"], "sharegpt");
  EXPECT_EQ(j["config"]["model"], "stub-model");
  EXPECT_TRUE(j["ttft_ms"].contains("p95"));
  ASSERT_EQ(j["requests"].size(), 6u);
  for (const Json& r : j["requests"]) {
    EXPECT_EQ(r["success"], true);
    EXPECT_EQ(r["output_tokens"], r["expected_output_len"]);
  }
  EXPECT_GT(j["bench_client"]["cpu_user_s"].get<double>() +
                j["bench_client"]["cpu_system_s"].get<double>(),
            0);
}

TEST(BenchRunTest, AllFailingClusterStillSavesTheErrors) {
  auto server = FastStub(grpc::StatusCode::UNAVAILABLE);
  ASSERT_NE(server, nullptr);
  BenchOptions o;
  o.server = server->address();
  o.random.num_prompts = 5;
  o.random.input_len = 4;
  o.random.output_len = 2;
  o.save_result = true;
  o.result_dir = ::testing::TempDir();
  o.result_filename = "all-failed.json";
  std::ostringstream out, err;
  auto outcome = RunBench(o, out, err);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(OutcomeExitCode(*outcome), 1);
  EXPECT_EQ(OutcomeProblem(*outcome),
            "5 of 5 requests did not complete; 5 failed (UNAVAILABLE: 5)");
  const Json j = ReadJson(outcome->result_path);
  EXPECT_EQ(j["errors_by_code"]["UNAVAILABLE"], 5);
  EXPECT_EQ(j["requests"][0]["error_code"], "UNAVAILABLE");
}

TEST(BenchRunTest, VocabRangeIsCheckedAgainstTheModel) {
  auto server = FastStub();
  ASSERT_NE(server, nullptr);
  BenchOptions o;
  o.server = server->address();
  o.random.vocab_end = 60000;  // the stub's vocabulary has 49152
  std::ostringstream out, err;
  const absl::Status s = RunBench(o, out, err).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--vocab-range"), absl::string_view::npos) << s;
  o.random.vocab_end = 40000;
  o.runner.model = "other-model";
  EXPECT_EQ(RunBench(o, out, err).status().code(), absl::StatusCode::kNotFound);
}

TEST(BenchBinaryTest, BadFlagsExitWithAMessage) {
  struct Case {
    std::string flags;
    std::string message;
  };
  const Case cases[] = {
      {"", "--server"},
      {"--server=x:1 --request-rate=0", "--request-rate must be > 0"},
      {"--server=x:1 --request-rate=-2", "--request-rate must be > 0"},
      {"--server=x:1 --goodput=ttft:100,itl:5", "unknown metric 'itl'"},
      {"--server=x:1 --goodput ttft:100 lat:5", "unknown metric 'lat'"},
      {"--server=x:1 --random-range-ratio=1.5", "--random-range-ratio"},
      {"--server=x:1 --dataset-name=sonnet", "--dataset-name"},
      {"--server=x:1 --dataset-name=sharegpt", "--dataset-path is required"},
      {"--server=x:1 --max-concurrency=-1", "--max-concurrency"},
      {"--server=x:1 --metric-percentiles=150", "--metric-percentiles"},
      {"--server=x:1 stray", "unexpected argument 'stray'"},
      {"profile --server=x:1 --profile-max-error=0", "--profile_max_error"},
  };
  for (const Case& c : cases) {
    const Command r = RunBinary(c.flags);
    EXPECT_EQ(r.exit_code, 2) << c.flags << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.flags << "\n"
                                                           << r.output;
  }
}

TEST(BenchBinaryTest, UnreachableServerExitsWithAMessage) {
  const Command r =
      RunBinary("--server=127.0.0.1:1 --connect-timeout-s=1 --num-prompts=2");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("cannot connect"), std::string::npos) << r.output;
}

TEST(BenchBinaryTest, MalformedDatasetExitsWithAMessage) {
  auto server = FastStub();
  ASSERT_NE(server, nullptr);
  const std::string path = ::testing::TempDir() + "/malformed.json";
  std::ofstream(path) << "[{\"conversations\": [{\"from\": \"human\"";
  const Command r =
      RunBinary(absl::StrCat("--server=", server->address(),
                             " --dataset-name=sharegpt --dataset-path=", path));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("is not valid JSON"), std::string::npos) << r.output;
}

TEST(BenchBinaryTest, PartialFailureSavesResultsAndExitsThree) {
  auto server = FastStub(grpc::StatusCode::RESOURCE_EXHAUSTED, 2);
  ASSERT_NE(server, nullptr);
  const Command r = RunBinary(
      absl::StrCat("--server=", server->address(),
                   " --num-prompts=6 --random-input-len=4 --random-output-len=3"
                   " --request-rate=100 --seed=3 --goodput ttft:1000 tpot:500"
                   " --save-result --result-dir=",
                   ::testing::TempDir(), " --result-filename=partial.json"));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("3 failed (RESOURCE_EXHAUSTED: 3)"),
            std::string::npos)
      << r.output;
  const Json j = ReadJson(::testing::TempDir() + "/partial.json");
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["completed"], 3);
  EXPECT_EQ(j["failed"], 3);
  EXPECT_EQ(j["slo"]["ttft_ms"], 1000.0);
  EXPECT_EQ(j["slo"]["tpot_ms"], 500.0);
  EXPECT_EQ(j["good_requests"],
            CountMeetingSlo(j, *ParseSlo("ttft:1000 tpot:500")));
  EXPECT_EQ(j["config"]["request_rate"], "100");
}

}  // namespace
}  // namespace baton::bench
