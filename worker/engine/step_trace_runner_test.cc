#include "worker/engine/step_trace_runner.h"

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "worker/engine/fault_injecting_runner.h"

namespace baton {
namespace {

// Computes nothing; its health is what the test sets.
class IdleRunner : public ForwardRunner {
 public:
  absl::Status Forward(std::span<const ForwardItem> items,
                       std::vector<float>* /*logits*/,
                       const LayerDoneFn& /*on_layer_done*/) override {
    forwarded += static_cast<int>(items.size());
    return absl::OkStatus();
  }
  int forwarded = 0;
};

ForwardRunnerFactory Idle() {
  return [](const ModelWeights*, KvCache*,
            ThreadPool*) -> absl::StatusOr<std::unique_ptr<ForwardRunner>> {
    return std::make_unique<IdleRunner>();
  };
}

std::vector<nlohmann::json> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

TEST(StepTraceRunnerTest, WritesEveryStepsBatchAndOutcome) {
  const std::string path = ::testing::TempDir() + "/step_trace_test.jsonl";
  // Traced over a runner that fails from its second step: the trace says
  // which steps failed.
  auto runner = StepTraceRunnerFactory(FaultInjectingRunnerFactory(Idle(), 2),
                                       path)(nullptr, nullptr, nullptr);
  ASSERT_TRUE(runner.ok()) << runner.status();
  const std::vector<int32_t> prompt(37, 1), next(1, 2);
  const ForwardItem prefill{.start_pos = 16,
                            .tokens = std::span(prompt),
                            .logits = LogitsMode::kNone};
  const ForwardItem decode{.start_pos = 300, .tokens = std::span(next)};
  std::vector<float> logits;
  const std::vector<ForwardItem> mixed = {decode, prefill};
  EXPECT_TRUE((*runner)->Forward(mixed, &logits, nullptr).ok());
  EXPECT_FALSE(
      (*runner)->Forward(std::span(&decode, 1), &logits, nullptr).ok());

  const std::vector<nlohmann::json> lines = ReadLines(path);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["items"], nlohmann::json::parse("[[300,1,1],[16,37,0]]"));
  EXPECT_EQ(lines[0]["ok"], true);
  EXPECT_EQ(lines[1]["items"], nlohmann::json::parse("[[300,1,1]]"));
  EXPECT_EQ(lines[1]["ok"], false);
  EXPECT_GE(lines[0]["seconds"].get<double>(), 0);
  EXPECT_GE(lines[1]["start"].get<double>(), lines[0]["start"].get<double>());
  // The wrapped runner's health passes through (the injected fault).
  EXPECT_FALSE((*runner)->health().ok());
}

TEST(StepTraceRunnerTest, AnUnwritableFileIsAnErrorNamingIt) {
  auto runner = StepTraceRunnerFactory(Idle(), "/nonexistent-dir/trace.jsonl")(
      nullptr, nullptr, nullptr);
  ASSERT_FALSE(runner.ok());
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(runner.status().message().find("/nonexistent-dir/trace.jsonl"),
            std::string::npos)
      << runner.status();
}

}  // namespace
}  // namespace baton
