// The coordinator under thousands of concurrent streams: its added latency,
// the rate it takes requests at, its threads, memory and CPU, at several
// stream counts and worker counts. Workers are minimal fake workers in this
// process (scale_fixture.h: Prefill answers its first token at once, Decode
// holds every stream until the bench lets them all go), so what is measured
// is the coordinator: tokenization, admission, routing, the state machine,
// its worker RPCs and the client stream, not a model.
//
// Per configuration: N client streams are started at --rate per second
// (each stays open, so the load grows to N streams held); each is routed
// (ReserveKv on a decode worker, Prefill on a prefill worker), gets its
// first token and waits in Decode. Once all N are held, the bench reads the
// process's threads, RSS and CPU time, releases every stream and collects
// the results.
//   - coordinator TTFT: GenerateResult.timings.ttft_ms, the coordinator's own
//     arrival-to-first-token time (the fake prefill worker computes
//     nothing, so all of it is the coordinator's and the RPC hops');
//   - client TTFT: the client's send to its first message;
//   - ramp rate: N / the time from the first send until all N are held
//     (with --rate=0, all sent at once: the rate the coordinator sustains).
// Client, coordinator and fake workers share the process (and its cores),
// so RSS and CPU per stream are upper bounds for the coordinator alone.
//
//   build/bin/coordinator_scale_bench --streams=1000,5000,10000
//       --workers=8,32,64 --json=/tmp/scale.json   (one line)
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc/serving.h"
#include "common/test_util.h"
#include "coordinator/service/coordinator_services.h"
#include "coordinator/service/scale_fixture.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, streams, "1000,5000,10000",
          "concurrent streams per configuration");
ABSL_FLAG(std::string, workers, "8,32,64",
          "fake workers per configuration (half prefill, half decode)");
ABSL_FLAG(int, call_threads, 4, "the coordinator's executor threads");
ABSL_FLAG(double, rate, 2000,
          "new streams per second (evenly spaced; 0: all at once)");
ABSL_FLAG(std::string, json, "", "also write the figures to this file");
ABSL_FLAG(bool, deadlock_detection, false,
          "keep Abseil's mutex deadlock detection on (the servers turn it "
          "off, as here by default; tests keep it)");

namespace baton::coordinator {
namespace {

using SteadyClock = std::chrono::steady_clock;

std::vector<int> ParseList(const std::string& text) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int value = 0;
    if (!absl::SimpleAtoi(part, &value) || value < 1) {
      std::fprintf(stderr, "not a positive count: '%s'\n",
                   std::string(part).c_str());
      std::exit(2);
    }
    out.push_back(value);
  }
  return out;
}

// Resident set size of the process, in MiB.
double RssMiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024;
  }
  return -1;
}

double CpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) /
             1e6;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t at = std::min(
      v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[at];
}

double Seconds(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

nlohmann::json RunOne(int num_workers, int num_streams) {
  auto model = ServedModel::Load(testing::DefaultModelPath());
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    std::exit(1);
  }
  ClusterOptions options = scale::ScaleOptions(num_streams);
  options.call_threads = absl::GetFlag(FLAGS_call_threads);
  auto cluster = Cluster::Create(options, std::move(*model), RealClock());
  if (!cluster.ok()) {
    std::fprintf(stderr, "%s\n", cluster.status().ToString().c_str());
    std::exit(1);
  }
  ControlPlaneService control_plane(cluster->get());
  BatonService api(cluster->get());
  auto coordinator = StartServer(
      "127.0.0.1:0", {{&control_plane, v1::Coordinator::service_full_name()},
                      {&api, v1::Baton::service_full_name()}});
  if (!coordinator.ok()) {
    std::fprintf(stderr, "%s\n", coordinator.status().ToString().c_str());
    std::exit(1);
  }
  auto channel = grpc::CreateChannel(coordinator->address,
                                     grpc::InsecureChannelCredentials());
  auto baton = v1::Baton::NewStub(channel);
  auto control = v1::Coordinator::NewStub(channel);

  std::vector<std::unique_ptr<scale::FakeWorker>> services;
  std::vector<RunningServer> workers;
  for (int i = 0; i < num_workers; ++i) {
    const bool prefill = i % 2 == 0;
    services.push_back(std::make_unique<scale::FakeWorker>());
    auto running =
        StartServer("127.0.0.1:0",
                    {{services.back().get(), v1::Worker::service_full_name()}});
    if (!running.ok()) {
      std::fprintf(stderr, "%s\n", running.status().ToString().c_str());
      std::exit(1);
    }
    const absl::Status registered = scale::RegisterFakeWorker(
        *control, running->address,
        prefill ? v1::WORKER_ROLE_PREFILL : v1::WORKER_ROLE_DECODE,
        (*cluster)->model().id());
    if (!registered.ok()) {
      std::fprintf(stderr, "%s\n", registered.ToString().c_str());
      std::exit(1);
    }
    workers.push_back(std::move(*running));
  }
  auto held = [&] {
    int total = 0;
    for (const auto& s : services) total += s->held();
    return total;
  };

  const double rss_before = RssMiB();
  const int threads_before = scale::ProcessThreads();
  const double cpu_before = CpuSeconds();
  const SteadyClock::time_point start = SteadyClock::now();
  std::vector<std::unique_ptr<scale::ClientStream>> streams;
  streams.reserve(static_cast<size_t>(num_streams));
  const double rate = absl::GetFlag(FLAGS_rate);
  for (int i = 0; i < num_streams; ++i) {
    if (rate > 0) {
      std::this_thread::sleep_until(
          start + std::chrono::duration_cast<SteadyClock::duration>(
                      std::chrono::duration<double>(i / rate)));
    }
    streams.push_back(std::make_unique<scale::ClientStream>(baton.get()));
  }
  const bool all_held = scale::Eventually([&] { return held() == num_streams; },
                                          absl::Minutes(10));
  const SteadyClock::time_point ramped = SteadyClock::now();
  const double cpu_ramped = CpuSeconds();
  const double rss_held = RssMiB();
  const int threads_held = scale::ProcessThreads();
  const int calls = (*cluster)->active_calls();

  for (const auto& s : services) s->ReleaseAll();
  scale::Eventually([&] {
    for (const auto& s : streams) {
      if (!s->done()) return false;
    }
    return true;
  });
  const SteadyClock::time_point ended = SteadyClock::now();
  const double cpu_ended = CpuSeconds();

  std::vector<double> coordinator_ttft;
  std::vector<double> client_ttft;
  int errors = 0;
  for (const auto& s : streams) {
    if (s->Outcome() != "FINISH_REASON_LENGTH") {
      if (errors < 3) std::fprintf(stderr, "error: %s\n", s->Outcome().c_str());
      ++errors;
      continue;
    }
    coordinator_ttft.push_back(s->result().timings().ttft_ms());
    client_ttft.push_back(s->ClientTtftMs());
  }
  streams.clear();
  scale::Eventually([&] { return (*cluster)->active_calls() == 0; });
  scale::StopAll(**cluster, *coordinator, workers);

  nlohmann::json row;
  row["workers"] = num_workers;
  row["streams"] = num_streams;
  row["all_held"] = all_held;
  row["calls_in_flight"] = calls;
  row["errors"] = errors;
  row["ramp_requests_per_s"] = num_streams / Seconds(start, ramped);
  row["coordinator_ttft_ms_p50"] = Percentile(coordinator_ttft, 0.5);
  row["coordinator_ttft_ms_p99"] = Percentile(coordinator_ttft, 0.99);
  row["client_ttft_ms_p50"] = Percentile(client_ttft, 0.5);
  row["client_ttft_ms_p99"] = Percentile(client_ttft, 0.99);
  row["threads_before"] = threads_before;
  row["threads_held"] = threads_held;
  row["rss_before_mib"] = rss_before;
  row["rss_held_mib"] = rss_held;
  row["rss_kib_per_stream"] = (rss_held - rss_before) * 1024 / num_streams;
  row["cpu_ms_per_request"] = (cpu_ended - cpu_before) * 1e3 / num_streams;
  row["cpu_ramp_s"] = cpu_ramped - cpu_before;
  row["release_s"] = Seconds(ramped, ended);
  return row;
}

int Main() {
  const std::vector<int> worker_counts =
      ParseList(absl::GetFlag(FLAGS_workers));
  for (int w : worker_counts) {
    if (w < 2) {
      std::fprintf(stderr,
                   "--workers: %d is below 2 (one prefill and one "
                   "decode worker at least)\n",
                   w);
      return 2;
    }
  }
  std::printf("host: ");
  std::fflush(stdout);
  if (std::system("scripts/host_info.sh 2>/dev/null | head -1") != 0) {
    std::printf("(scripts/host_info.sh not found)\n");
  }
  std::printf(
      "coordinator executor threads: %d; cores online: %ld; new streams: "
      "%.0f/s (0: all at once)\n",
      absl::GetFlag(FLAGS_call_threads), sysconf(_SC_NPROCESSORS_ONLN),
      absl::GetFlag(FLAGS_rate));
  std::printf("%7s %7s %9s %8s %8s %8s %8s %7s %8s %9s %8s %6s\n", "workers",
              "streams", "ramp r/s", "coordTTFT", "p99", "clientTTFT", "p99",
              "threads", "RSS MiB", "KiB/strm", "CPU ms/r", "errors");
  nlohmann::json rows = nlohmann::json::array();
  for (int w : worker_counts) {
    for (int n : ParseList(absl::GetFlag(FLAGS_streams))) {
      nlohmann::json row = RunOne(w, n);
      std::printf(
          "%7d %7d %9.0f %8.2f %8.2f %8.2f %8.2f %7d %8.0f %9.1f %8.3f %6d\n",
          w, n, row["ramp_requests_per_s"].get<double>(),
          row["coordinator_ttft_ms_p50"].get<double>(),
          row["coordinator_ttft_ms_p99"].get<double>(),
          row["client_ttft_ms_p50"].get<double>(),
          row["client_ttft_ms_p99"].get<double>(),
          row["threads_held"].get<int>(), row["rss_held_mib"].get<double>(),
          row["rss_kib_per_stream"].get<double>(),
          row["cpu_ms_per_request"].get<double>(), row["errors"].get<int>());
      std::fflush(stdout);
      rows.push_back(std::move(row));
    }
  }
  const std::string json = absl::GetFlag(FLAGS_json);
  if (!json.empty()) std::ofstream(json) << rows.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace baton::coordinator

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_deadlock_detection)) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
  return baton::coordinator::Main();
}
