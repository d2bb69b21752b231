// What the cluster adds to a request's latency, against the in-process
// engine, in one run:
//   - in-process: Engine::Submit on this process, one request at a time;
//     TTFT = submit to the first token's callback, total = to the last;
//   - cluster: the same requests through baton-coordinator to workers on
//     loopback (scripts' shapes: 2C colocated, 1P1D split), one at a time;
//     TTFT = client send to the first streamed message, total = to the end;
//   - per request, the coordinator's share: client TTFT minus the prefill
//     worker's own arrival-to-first-token time (PhaseTimings.prefill_ms),
//     i.e. client -> coordinator -> (ReserveKv) -> worker -> client hops,
//     tokenization and routing.
//
//   build/bin/coordinator_overhead_bench --shapes=2C,1P1D --requests=200
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "common/test_util.h"
#include "nlohmann/json.hpp"
#include "tests/cluster/cluster_test_util.h"
#include "tests/cluster/local_cluster.h"
#include "worker/engine/engine.h"
#include "worker/engine/model_bundle.h"

ABSL_FLAG(std::string, shapes, "2C,1P1D", "cluster shapes to measure");
ABSL_FLAG(int, requests, 200, "requests per configuration (after warm-up)");
ABSL_FLAG(int, max_tokens, 8, "tokens generated per request (greedy)");
ABSL_FLAG(std::string, json, "", "also write the figures to this file");

namespace baton {
namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr char kUser[] = "Name three colors of the rainbow.";
constexpr int kWarmUp = 10;

double Ms(SteadyClock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * v.size()));
  return v[i];
}

struct Series {
  std::vector<double> ttft_ms;
  std::vector<double> total_ms;
  std::vector<double> coordinator_ms;  // cluster only
};

nlohmann::json Summary(const std::vector<double>& v) {
  return {{"p50", Percentile(v, 0.5)},
          {"p90", Percentile(v, 0.9)},
          {"p99", Percentile(v, 0.99)}};
}

Series InProcess(int requests, int max_tokens) {
  auto bundle = LoadModelBundle(testing::DefaultModelPath());
  BATON_CHECK(bundle.ok()) << bundle.status();
  EngineOptions options;
  options.num_threads = 1;
  auto engine =
      Engine::Create(options, bundle->weights.get(), bundle->tokenizer.get());
  BATON_CHECK(engine.ok()) << engine.status();
  const std::vector<int32_t> prompt = bundle->EncodePrompt(kUser, false);
  Series s;
  for (int i = 0; i < kWarmUp + requests; ++i) {
    GenerationRequest request;
    request.id = "r" + std::to_string(i);
    request.prompt = prompt;
    request.params.temperature = 0.0;
    request.params.seed = 1;
    request.params.max_tokens = max_tokens;
    request.params.ignore_eos = true;
    SteadyClock::time_point first{};
    SteadyClock::time_point last{};
    const SteadyClock::time_point start = SteadyClock::now();
    BATON_CHECK((*engine)
                    ->Submit(request,
                             [&](const RequestOutput& out) {
                               if (!out.tokens.empty() &&
                                   first == SteadyClock::time_point{}) {
                                 first = SteadyClock::now();
                               }
                               last = SteadyClock::now();
                             })
                    .ok());
    (*engine)->RunUntilIdle();
    if (i < kWarmUp) continue;
    s.ttft_ms.push_back(Ms(first - start));
    s.total_ms.push_back(Ms(last - start));
  }
  return s;
}

Series Cluster(const std::string& shape, int requests, int max_tokens) {
  testing::LocalClusterOptions options;
  options.prefill = shape == "1P1D" ? 1 : 0;
  options.decode = shape == "1P1D" ? 1 : 0;
  options.both = shape == "2C" ? 2 : 0;
  auto cluster = testing::LocalCluster::Start(options);
  BATON_CHECK(cluster.ok()) << cluster.status();
  Series s;
  for (int i = 0; i < kWarmUp + requests; ++i) {
    v1::GenerateRequest request =
        testing::ChatRequest(kUser, max_tokens, 0.0, /*seed=*/1);
    request.mutable_sampling()->set_ignore_eos(true);
    grpc::ClientContext context;
    const SteadyClock::time_point start = SteadyClock::now();
    auto reader = (*cluster)->baton().Generate(&context, request);
    v1::GenerateResponse response;
    SteadyClock::time_point first{};
    v1::GenerateResult result;
    while (reader->Read(&response)) {
      if (first == SteadyClock::time_point{}) first = SteadyClock::now();
      if (response.has_result()) result = response.result();
    }
    const SteadyClock::time_point end = SteadyClock::now();
    const grpc::Status status = reader->Finish();
    BATON_CHECK(status.ok()) << status.error_message();
    if (i < kWarmUp) continue;
    s.ttft_ms.push_back(Ms(first - start));
    s.total_ms.push_back(Ms(end - start));
    s.coordinator_ms.push_back(Ms(first - start) -
                               result.timings().prefill_ms());
  }
  BATON_CHECK((*cluster)->Stop().ok());
  return s;
}

int Main() {
  const int requests = absl::GetFlag(FLAGS_requests);
  const int max_tokens = absl::GetFlag(FLAGS_max_tokens);
  nlohmann::json out;
  const Series local = InProcess(requests, max_tokens);
  out["in_process"] = {{"ttft_ms", Summary(local.ttft_ms)},
                       {"total_ms", Summary(local.total_ms)}};
  std::printf("%d requests each, %d tokens, greedy, 1 thread per engine\n\n",
              requests, max_tokens);
  std::printf("%-12s %12s %12s %12s %12s %18s %18s\n", "setup", "TTFT p50",
              "TTFT p90", "total p50", "total p90", "coordinator p50",
              "coordinator p90");
  std::printf("%-12s %12.2f %12.2f %12.2f %12.2f %18s %18s\n", "in-process",
              Percentile(local.ttft_ms, 0.5), Percentile(local.ttft_ms, 0.9),
              Percentile(local.total_ms, 0.5), Percentile(local.total_ms, 0.9),
              "-", "-");
  for (absl::string_view shape_view :
       absl::StrSplit(absl::GetFlag(FLAGS_shapes), ',')) {
    const std::string shape(shape_view);
    const Series s = Cluster(shape, requests, max_tokens);
    out[shape] = {
        {"ttft_ms", Summary(s.ttft_ms)},
        {"total_ms", Summary(s.total_ms)},
        {"coordinator_ms", Summary(s.coordinator_ms)},
        {"ttft_p50_minus_in_process_ms",
         Percentile(s.ttft_ms, 0.5) - Percentile(local.ttft_ms, 0.5)},
        {"total_p50_minus_in_process_ms",
         Percentile(s.total_ms, 0.5) - Percentile(local.total_ms, 0.5)}};
    std::printf("%-12s %12.2f %12.2f %12.2f %12.2f %18.2f %18.2f\n",
                ("cluster " + shape).c_str(), Percentile(s.ttft_ms, 0.5),
                Percentile(s.ttft_ms, 0.9), Percentile(s.total_ms, 0.5),
                Percentile(s.total_ms, 0.9), Percentile(s.coordinator_ms, 0.5),
                Percentile(s.coordinator_ms, 0.9));
  }
  std::printf(
      "\ncoordinator = client TTFT - the prefill worker's own arrival-to-first-"
      "token time\n");
  if (!absl::GetFlag(FLAGS_json).empty()) {
    FILE* f = std::fopen(absl::GetFlag(FLAGS_json).c_str(), "w");
    BATON_CHECK(f != nullptr);
    std::fprintf(f, "%s\n", out.dump(2).c_str());
    std::fclose(f);
  }
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return baton::Main();
}
