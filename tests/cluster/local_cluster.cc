#include "tests/cluster/local_cluster.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/auth/bearer_interceptor.h"
#include "common/status_macros.h"
#include "common/test_util.h"
#include "tests/cluster/cluster_test_util.h"

namespace baton::testing {
namespace {

// "... MARKER HOST:PORT, ..." or "... MARKER HOST:PORT" (MARKER "listening
// on " or "control ").
absl::StatusOr<std::string> ListeningAddress(
    const std::string& line, const std::string& marker = "listening on ") {
  const size_t at = line.find(marker);
  if (at == std::string::npos) {
    return absl::InternalError(
        absl::StrCat("unexpected first line '", line, "' (no '", marker, "')"));
  }
  const size_t begin = at + marker.size();
  const size_t end = line.find(',', begin);
  return line.substr(begin, end == std::string::npos ? end : end - begin);
}

std::unique_ptr<grpc::ClientContext> ShortContext() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(5));
  return context;
}

}  // namespace

std::string BinaryDir() { return BATON_TEST_BINARY_DIR; }

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(
    const LocalClusterOptions& options) {
  std::unique_ptr<LocalCluster> cluster(new LocalCluster());
  const std::string model = DefaultModelPath();
  std::vector<std::string> argv = {
      BinaryDir() + "/baton-coordinator",
      "--listen=127.0.0.1:0",
      "--control_listen=127.0.0.1:0",
      "--model=" + model,
      absl::StrCat("--heartbeat_ms=", options.heartbeat_ms),
      absl::StrCat("--lease_ttl_ms=", options.lease_ttl_ms),
      absl::StrCat("--drain_timeout_s=", options.coordinator_drain_timeout_s)};
  if (options.http) argv.push_back("--http_listen=127.0.0.1:0");
  argv.insert(argv.end(), options.coordinator_flags.begin(),
              options.coordinator_flags.end());
  cluster->coordinator_argv_ = std::move(argv);
  cluster->http_ = options.http;
  BATON_ASSIGN_OR_RETURN(
      std::shared_ptr<grpc::ChannelCredentials> public_credentials,
      MakeChannelCredentials(options.public_client_tls));
  BATON_ASSIGN_OR_RETURN(
      std::shared_ptr<grpc::ChannelCredentials> control_credentials,
      MakeChannelCredentials(options.control_client_tls));
  BATON_RETURN_IF_ERROR(cluster->SpawnCoordinator());
  cluster->baton_ = v1::Baton::NewStub(CreateChannelWithKey(
      cluster->address_, public_credentials, options.api_key));

  std::vector<std::string> roles;
  for (int i = 0; i < options.prefill; ++i) roles.push_back("prefill");
  for (int i = 0; i < options.decode; ++i) roles.push_back("decode");
  for (int i = 0; i < options.both; ++i) roles.push_back("both");
  // Start all, then wait for each: the workers load the model in parallel.
  // (From this thread: a child dies with the thread that started it.)
  std::vector<std::unique_ptr<ChildProcess>> spawned;
  for (size_t i = 0; i < roles.size(); ++i) {
    const int64_t mib = roles[i] != "prefill" && options.decode_kv_cache_mib > 0
                            ? options.decode_kv_cache_mib
                            : options.kv_cache_mib;
    std::vector<std::string> argv = {
        BinaryDir() + "/baton-worker",
        "--role=" + roles[i],
        "--listen=127.0.0.1:0",
        "--kv_listen=127.0.0.1:0",
        "--model=" + model,
        absl::StrCat("--threads=", options.threads),
        absl::StrCat("--kv_cache_mib=", mib),
        absl::StrCat("--drain_timeout_s=", options.drain_timeout_s),
        "--coordinator=" + cluster->control_address_};
    argv.insert(argv.end(), options.worker_flags.begin(),
                options.worker_flags.end());
    if (auto it = options.flags_of_worker.find(static_cast<int>(i));
        it != options.flags_of_worker.end()) {
      argv.insert(argv.end(), it->second.begin(), it->second.end());
    }
    auto child = ChildProcess::Start(argv);
    if (!child.ok()) return child.status();
    spawned.push_back(std::move(*child));
  }
  for (size_t i = 0; i < roles.size(); ++i) {
    if (absl::Status s = spawned[i]->WaitForFirstLine(absl::Seconds(60));
        !s.ok()) {
      return s;
    }
    Worker worker;
    worker.role = roles[i];
    worker.process = std::move(spawned[i]);
    auto worker_address = ListeningAddress(worker.process->first_line());
    if (!worker_address.ok()) return worker_address.status();
    worker.address = *worker_address;
    worker.stub = v1::Worker::NewStub(
        grpc::CreateChannel(worker.address, control_credentials));
    cluster->workers_.push_back(std::move(worker));
  }
  if (options.wait_healthy) {
    absl::Status healthy =
        cluster->WaitHealthy(static_cast<int>(roles.size()), absl::Seconds(30));
    if (!healthy.ok()) return healthy;
  }
  return cluster;
}

absl::Status LocalCluster::SpawnCoordinator() {
  auto coordinator = ChildProcess::Spawn(coordinator_argv_, absl::Seconds(30));
  if (!coordinator.ok()) return coordinator.status();
  coordinator_ = std::move(*coordinator);
  BATON_ASSIGN_OR_RETURN(address_,
                         ListeningAddress(coordinator_->first_line()));
  BATON_ASSIGN_OR_RETURN(
      control_address_,
      ListeningAddress(coordinator_->first_line(), ", control "));
  if (http_) {
    // "baton-coordinator http on HOST:PORT", printed after the first line.
    const std::string marker = "baton-coordinator http on ";
    auto line = coordinator_->WaitForLine(marker, absl::Seconds(10));
    if (!line.ok()) return line.status();
    http_address_ = line->substr(marker.size());
  }
  // A restart binds the same ports.
  for (std::string& arg : coordinator_argv_) {
    if (absl::StartsWith(arg, "--listen=")) arg = "--listen=" + address_;
    if (absl::StartsWith(arg, "--control_listen=")) {
      arg = "--control_listen=" + control_address_;
    }
    if (http_ && absl::StartsWith(arg, "--http_listen=")) {
      arg = "--http_listen=" + http_address_;
    }
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::RestartCoordinator() {
  coordinator_->Signal(SIGKILL);
  coordinator_->Wait(absl::Seconds(10)).IgnoreError();
  return SpawnCoordinator();
}

LocalCluster::~LocalCluster() {
  for (Worker& w : workers_) w.process->Signal(SIGTERM);
  if (coordinator_ != nullptr) coordinator_->Signal(SIGTERM);
  for (Worker& w : workers_) {
    if (!w.process->Wait(absl::Seconds(10)).ok()) w.process->Signal(SIGKILL);
  }
  if (coordinator_ != nullptr && !coordinator_->Wait(absl::Seconds(10)).ok()) {
    coordinator_->Signal(SIGKILL);
  }
}

namespace {

// SIGTERM (and SIGCONT, should it be stopped) to each, then waits for each
// to exit. OK if every one exits with status 0; otherwise the first
// failure, naming the process.
absl::Status TerminateAll(
    const std::vector<std::pair<std::string, ChildProcess*>>& running) {
  for (auto& [name, process] : running) {
    process->Signal(SIGTERM);
    process->Signal(SIGCONT);
  }
  // A guard against a hang, not a bound on shutdown: the last step of a
  // prefill and LeakSanitizer's exit check run first.
  const absl::Duration guard = absl::Seconds(30) + 50 * HostPace();
  absl::Status result;
  for (auto& [name, process] : running) {
    absl::StatusOr<int> status = process->Wait(guard);
    if (!status.ok()) {
      process->Signal(SIGKILL);
      result.Update(absl::DeadlineExceededError(
          absl::StrCat(name, " did not stop within ",
                       absl::FormatDuration(guard), " of SIGTERM")));
    } else if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
      result.Update(absl::InternalError(absl::StrCat(
          name, " ended with wait status ", *status,
          WIFSIGNALED(*status)
              ? absl::StrCat(" (signal ", WTERMSIG(*status), ")")
              : absl::StrCat(" (exit code ", WEXITSTATUS(*status), ")"))));
    }
  }
  return result;
}

}  // namespace

absl::Status LocalCluster::Stop() {
  std::vector<std::pair<std::string, ChildProcess*>> running;
  for (Worker& w : workers_) {
    if (w.process->running()) {
      running.emplace_back(absl::StrCat(w.role, " worker ", w.address),
                           w.process.get());
    }
  }
  if (coordinator_ != nullptr && coordinator_->running()) {
    running.emplace_back("coordinator", coordinator_.get());
  }
  return TerminateAll(running);
}

absl::Status LocalCluster::StopWorker(int index) {
  Worker& w = workers_.at(static_cast<size_t>(index));
  if (!w.process->running()) {
    return absl::FailedPreconditionError(
        absl::StrCat(w.role, " worker ", w.address, " is not running"));
  }
  return TerminateAll(
      {{absl::StrCat(w.role, " worker ", w.address), w.process.get()}});
}

absl::Status LocalCluster::WaitHealthy(int count, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string last;
  while (absl::Now() < deadline) {
    v1::GetClusterStatusResponse status;
    auto context = ShortContext();
    grpc::Status rpc = baton_->GetClusterStatus(
        context.get(), v1::GetClusterStatusRequest(), &status);
    if (rpc.ok()) {
      int healthy = 0;
      for (const v1::WorkerStatus& w : status.workers()) {
        if (w.health() == v1::WORKER_HEALTH_HEALTHY) ++healthy;
      }
      if (healthy == count) return absl::OkStatus();
      last = absl::StrCat(healthy, " of ", count, " healthy");
    } else {
      last = rpc.error_message();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("workers not healthy in time: ", last));
}

absl::Status LocalCluster::WaitAllFree(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string holder;
  while (true) {
    holder.clear();
    for (const Worker& w : workers_) {
      if (!w.process->running()) continue;
      v1::GetWorkerStatusResponse status;
      auto context = ShortContext();
      grpc::Status rpc = w.stub->GetWorkerStatus(
          context.get(), v1::GetWorkerStatusRequest(), &status);
      if (!rpc.ok()) {
        holder = absl::StrCat(w.role, " worker ", w.address,
                              " unreachable: ", rpc.error_message());
        break;
      }
      if (status.load().kv_blocks_free() != status.load().kv_blocks_total() ||
          status.leased_request_ids_size() > 0) {
        holder = absl::StrCat(
            w.role, " worker ", w.address, ": kv_blocks_free ",
            status.load().kv_blocks_free(), " of ",
            status.load().kv_blocks_total(), ", ",
            status.leased_request_ids_size(), " leased requests",
            status.leased_request_ids_size() > 0
                ? absl::StrCat(" (first '", status.leased_request_ids(0), "')")
                : "");
        break;
      }
    }
    if (holder.empty()) {
      v1::GetClusterStatusResponse status;
      auto context = ShortContext();
      grpc::Status rpc = baton_->GetClusterStatus(
          context.get(), v1::GetClusterStatusRequest(), &status);
      if (!rpc.ok()) {
        holder = absl::StrCat("coordinator: ", rpc.error_message());
      } else if (status.active_requests() != 0) {
        holder = absl::StrCat("coordinator: ", status.active_requests(),
                              " active requests");
      }
    }
    if (holder.empty()) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("KV blocks still held after ",
                       absl::FormatDuration(timeout), ": ", holder));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void LocalCluster::Kill(int index) {
  Worker& w = workers_.at(static_cast<size_t>(index));
  w.process->Signal(SIGKILL);
  w.process->Wait(absl::Seconds(10)).IgnoreError();
}

int LocalCluster::WorkerIndex(const std::string& address) const {
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (workers_[i].address == address) return static_cast<int>(i);
  }
  return -1;
}

absl::StatusOr<int> LocalCluster::WaitForStoppedWorker(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (workers_[i].process->PollStopped()) return static_cast<int>(i);
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("no worker stopped at a fault point within ",
                       absl::FormatDuration(timeout)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace baton::testing
