#include "tests/cluster/local_cluster.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

std::unique_ptr<grpc::ClientContext> ShortContext();

}  // namespace

grpc::Status LocalCluster::ClusterStatus(Coordinator& c,
                                         v1::GetClusterStatusResponse* status) {
  auto context = ShortContext();
  return c.baton->GetClusterStatus(context.get(), v1::GetClusterStatusRequest(),
                                   status);
}

namespace {

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
  if (options.coordinators < 1) {
    return absl::InvalidArgumentError(
        "LocalCluster: coordinators must be >= 1");
  }
  std::unique_ptr<LocalCluster> cluster(new LocalCluster());
  cluster->options_ = options;
  BATON_ASSIGN_OR_RETURN(cluster->public_credentials_,
                         MakeChannelCredentials(options.public_client_tls));
  BATON_ASSIGN_OR_RETURN(cluster->control_credentials_,
                         MakeChannelCredentials(options.control_client_tls));
  for (int r = 0; r < options.coordinators; ++r) {
    std::vector<std::string> argv = {
        BinaryDir() + "/baton-coordinator",
        "--listen=127.0.0.1:0",
        "--control_listen=127.0.0.1:0",
        "--model=" + DefaultModelPath(),
        absl::StrCat("--heartbeat_ms=", options.heartbeat_ms),
        absl::StrCat("--lease_ttl_ms=", options.lease_ttl_ms),
        absl::StrCat("--drain_timeout_s=", options.coordinator_drain_timeout_s),
        absl::StrCat("--local_prefill_tokens=", options.local_prefill_tokens),
        "--mutex_deadlock_detection"};
    if (options.coordinators > 1) {
      argv.push_back(absl::StrCat("--coordinator_id=replica", r));
    }
    if (options.http) argv.push_back("--http_listen=127.0.0.1:0");
    argv.insert(argv.end(), options.coordinator_flags.begin(),
                options.coordinator_flags.end());
    cluster->coordinators_.emplace_back();
    cluster->coordinators_.back().argv = std::move(argv);
    BATON_RETURN_IF_ERROR(cluster->SpawnCoordinator(r));
  }

  std::vector<std::string> roles;
  for (int i = 0; i < options.prefill; ++i) roles.push_back("prefill");
  for (int i = 0; i < options.decode; ++i) roles.push_back("decode");
  for (int i = 0; i < options.both; ++i) roles.push_back("both");
  // Start all, then wait for each: the workers load the model in parallel.
  // (From this thread: a child dies with the thread that started it.)
  std::vector<std::unique_ptr<ChildProcess>> spawned;
  for (size_t i = 0; i < roles.size(); ++i) {
    std::vector<std::string> extra;
    if (auto it = options.flags_of_worker.find(static_cast<int>(i));
        it != options.flags_of_worker.end()) {
      extra = it->second;
    }
    auto child = ChildProcess::Start(cluster->WorkerArgv(roles[i], extra));
    if (!child.ok()) return child.status();
    spawned.push_back(std::move(*child));
  }
  for (size_t i = 0; i < roles.size(); ++i) {
    BATON_RETURN_IF_ERROR(
        cluster->AdoptWorker(roles[i], std::move(spawned[i])));
  }
  if (options.wait_healthy) {
    absl::Status healthy =
        cluster->WaitHealthy(static_cast<int>(roles.size()), absl::Seconds(30));
    if (!healthy.ok()) return healthy;
  }
  return cluster;
}

std::vector<std::string> LocalCluster::WorkerArgv(
    const std::string& role, const std::vector<std::string>& extra) const {
  const int64_t mib = role != "prefill" && options_.decode_kv_cache_mib > 0
                          ? options_.decode_kv_cache_mib
                          : options_.kv_cache_mib;
  std::vector<std::string> argv = {
      BinaryDir() + "/baton-worker",
      "--role=" + role,
      "--listen=127.0.0.1:0",
      "--kv_listen=127.0.0.1:0",
      "--model=" + DefaultModelPath(),
      absl::StrCat("--threads=", options_.threads),
      absl::StrCat("--kv_cache_mib=", mib),
      absl::StrCat("--drain_timeout_s=", options_.drain_timeout_s),
      "--mutex_deadlock_detection",
      "--coordinator=" + ControlAddresses()};
  argv.insert(argv.end(), options_.worker_flags.begin(),
              options_.worker_flags.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

absl::Status LocalCluster::AdoptWorker(const std::string& role,
                                       std::unique_ptr<ChildProcess> process) {
  BATON_RETURN_IF_ERROR(process->WaitForFirstLine(absl::Seconds(60)));
  Worker worker;
  worker.role = role;
  worker.process = std::move(process);
  BATON_ASSIGN_OR_RETURN(worker.address,
                         ListeningAddress(worker.process->first_line()));
  worker.stub = v1::Worker::NewStub(
      grpc::CreateChannel(worker.address, control_credentials_));
  workers_.push_back(std::move(worker));
  return absl::OkStatus();
}

absl::StatusOr<int> LocalCluster::AddWorker(
    const std::string& role, const std::vector<std::string>& extra_flags) {
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<ChildProcess> child,
                         ChildProcess::Start(WorkerArgv(role, extra_flags)));
  BATON_RETURN_IF_ERROR(AdoptWorker(role, std::move(child)));
  return static_cast<int>(workers_.size()) - 1;
}

std::string LocalCluster::ControlAddresses() const {
  std::vector<std::string> addresses;
  for (const Coordinator& c : coordinators_) {
    addresses.push_back(c.control_address);
  }
  // With several replicas, the first is named by a DNS name (localhost), as
  // a headless Service names them: the worker resolves it.
  if (addresses.size() > 1 && absl::StartsWith(addresses[0], "127.0.0.1:")) {
    addresses[0] = absl::StrCat("localhost:", addresses[0].substr(10));
  }
  return absl::StrJoin(addresses, ",");
}

absl::Status LocalCluster::SpawnCoordinator(int replica) {
  Coordinator& c = coordinators_.at(static_cast<size_t>(replica));
  BATON_ASSIGN_OR_RETURN(c.process,
                         ChildProcess::Spawn(c.argv, absl::Seconds(30)));
  BATON_ASSIGN_OR_RETURN(c.address, ListeningAddress(c.process->first_line()));
  BATON_ASSIGN_OR_RETURN(
      c.control_address,
      ListeningAddress(c.process->first_line(), ", control "));
  if (options_.http) {
    // "baton-coordinator http on HOST:PORT", printed after the first line.
    const std::string marker = "baton-coordinator http on ";
    auto line = c.process->WaitForLine(marker, absl::Seconds(10));
    if (!line.ok()) return line.status();
    c.http_address = line->substr(marker.size());
  }
  // A restart binds the same ports.
  for (std::string& arg : c.argv) {
    if (absl::StartsWith(arg, "--listen=")) arg = "--listen=" + c.address;
    if (absl::StartsWith(arg, "--control_listen=")) {
      arg = "--control_listen=" + c.control_address;
    }
    if (options_.http && absl::StartsWith(arg, "--http_listen=")) {
      arg = "--http_listen=" + c.http_address;
    }
  }
  c.baton = v1::Baton::NewStub(
      CreateChannelWithKey(c.address, public_credentials_, options_.api_key));
  return absl::OkStatus();
}

absl::Status LocalCluster::RestartCoordinator() {
  KillCoordinator(0);
  return SpawnCoordinator(0);
}

void LocalCluster::KillCoordinator(int replica) {
  ChildProcess& process =
      *coordinators_.at(static_cast<size_t>(replica)).process;
  process.Signal(SIGKILL);
  process.Wait(absl::Seconds(10)).IgnoreError();
}

LocalCluster::~LocalCluster() {
  for (Worker& w : workers_) w.process->Signal(SIGTERM);
  for (Coordinator& c : coordinators_) {
    if (c.process != nullptr) c.process->Signal(SIGTERM);
  }
  for (Worker& w : workers_) {
    if (!w.process->Wait(absl::Seconds(10)).ok()) w.process->Signal(SIGKILL);
  }
  for (Coordinator& c : coordinators_) {
    if (c.process != nullptr && !c.process->Wait(absl::Seconds(10)).ok()) {
      c.process->Signal(SIGKILL);
    }
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
  for (size_t r = 0; r < coordinators_.size(); ++r) {
    ChildProcess* process = coordinators_[r].process.get();
    if (process != nullptr && process->running()) {
      running.emplace_back(coordinators_.size() == 1
                               ? std::string("coordinator")
                               : absl::StrCat("coordinator ", r),
                           process);
    }
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
    last.clear();
    for (size_t r = 0; r < coordinators_.size() && last.empty(); ++r) {
      Coordinator& c = coordinators_[r];
      if (!c.process->running()) continue;
      v1::GetClusterStatusResponse status;
      const grpc::Status rpc = ClusterStatus(c, &status);
      if (rpc.ok()) {
        int healthy = 0;
        for (const v1::WorkerStatus& w : status.workers()) {
          if (w.health() == v1::WORKER_HEALTH_HEALTHY) ++healthy;
        }
        if (healthy != count) {
          last =
              absl::StrCat(healthy, " of ", count, " healthy at ", c.address);
        }
      } else {
        last = absl::StrCat(c.address, ": ", rpc.error_message());
      }
    }
    if (last.empty()) return absl::OkStatus();
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
      // No block used by a request; free (cached prefixes included) and
      // used account for every block.
      const v1::WorkerLoad& load = status.load();
      if (load.kv_blocks_used() != 0 ||
          load.kv_blocks_free() != load.kv_blocks_total() ||
          load.kv_blocks_cached() > load.kv_blocks_free() ||
          status.leased_request_ids_size() > 0) {
        holder = absl::StrCat(
            w.role, " worker ", w.address, ": kv_blocks_used ",
            load.kv_blocks_used(), ", kv_blocks_free ", load.kv_blocks_free(),
            " (", load.kv_blocks_cached(), " cached) of ",
            load.kv_blocks_total(), ", ", status.leased_request_ids_size(),
            " leased requests",
            status.leased_request_ids_size() > 0
                ? absl::StrCat(" (first '", status.leased_request_ids(0), "')")
                : "");
        break;
      }
    }
    for (size_t r = 0; r < coordinators_.size() && holder.empty(); ++r) {
      Coordinator& c = coordinators_[r];
      if (!c.process->running()) continue;
      v1::GetClusterStatusResponse status;
      const grpc::Status rpc = ClusterStatus(c, &status);
      if (!rpc.ok()) {
        holder =
            absl::StrCat("coordinator ", c.address, ": ", rpc.error_message());
      } else if (status.active_requests() != 0) {
        holder = absl::StrCat("coordinator ", c.address, ": ",
                              status.active_requests(), " active requests");
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

absl::Status LocalCluster::WaitForLeases(int index, int count,
                                         absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string last = "no status";
  while (true) {
    v1::GetWorkerStatusResponse status;
    auto context = ShortContext();
    const grpc::Status rpc = workers_[index].stub->GetWorkerStatus(
        context.get(), v1::GetWorkerStatusRequest(), &status);
    if (rpc.ok()) {
      if (status.leased_request_ids_size() == count) return absl::OkStatus();
      last = absl::StrCat(status.leased_request_ids_size(), " leased");
    } else {
      last = rpc.error_message();
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("worker ", workers_[index].address, " did not hold ",
                       count, " leased requests within ",
                       absl::FormatDuration(timeout), " (", last, ")"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace baton::testing
