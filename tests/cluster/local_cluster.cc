#include "tests/cluster/local_cluster.h"

#include <dirent.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <set>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/test_util.h"

namespace baton::testing {
namespace {

// "... listening on HOST:PORT, ..." or "... listening on HOST:PORT".
absl::StatusOr<std::string> ListeningAddress(const std::string& line) {
  const std::string marker = "listening on ";
  const size_t at = line.find(marker);
  if (at == std::string::npos) {
    return absl::InternalError(
        absl::StrCat("unexpected first line '", line, "' (no 'listening on')"));
  }
  const size_t begin = at + marker.size();
  const size_t end = line.find(',', begin);
  return line.substr(begin, end == std::string::npos ? end : end - begin);
}

// The TCP ports process `pid` listens on, from its descriptors
// (/proc/PID/fd -> socket:[INODE]) and the kernel's socket tables.
absl::StatusOr<std::set<int>> ListeningPorts(pid_t pid) {
  const std::string fd_dir = absl::StrCat("/proc/", pid, "/fd");
  DIR* dir = opendir(fd_dir.c_str());
  if (dir == nullptr) {
    return absl::InternalError(absl::StrCat("cannot list ", fd_dir));
  }
  std::set<std::string> inodes;
  while (const dirent* entry = readdir(dir)) {
    char target[128];
    const std::string link = absl::StrCat(fd_dir, "/", entry->d_name);
    const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    absl::string_view name(target, static_cast<size_t>(n));
    if (absl::ConsumePrefix(&name, "socket:[") &&
        absl::ConsumeSuffix(&name, "]")) {
      inodes.insert(std::string(name));
    }
  }
  closedir(dir);
  std::set<int> ports;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout
      // inode ...; st 0A is LISTEN.
      const std::vector<std::string> fields =
          absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (fields.size() < 10 || fields[3] != "0A" ||
          inodes.count(fields[9]) == 0) {
        continue;
      }
      int port = 0;
      const size_t colon = fields[1].rfind(':');
      if (colon != std::string::npos &&
          absl::SimpleHexAtoi(fields[1].substr(colon + 1), &port)) {
        ports.insert(port);
      }
    }
  }
  return ports;
}

// The coordinator's HTTP address: its one listening port besides gRPC's.
// (ChildProcess keeps only the first stdout line, so the
// "baton-coordinator http on ..." line cannot be read here; the listener
// is up before the first line is printed.)
absl::StatusOr<std::string> HttpAddress(pid_t pid,
                                        const std::string& grpc_address) {
  auto ports = ListeningPorts(pid);
  if (!ports.ok()) return ports.status();
  int grpc_port = 0;
  if (!absl::SimpleAtoi(grpc_address.substr(grpc_address.rfind(':') + 1),
                        &grpc_port)) {
    return absl::InternalError(absl::StrCat("bad address ", grpc_address));
  }
  ports->erase(grpc_port);
  if (ports->size() != 1) {
    return absl::InternalError(absl::StrCat(
        "expected one HTTP port besides gRPC's ", grpc_port, ", found ",
        ports->size(), " (pass no other listening flag with http = true)"));
  }
  return absl::StrCat("127.0.0.1:", *ports->begin());
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
      BinaryDir() + "/baton-coordinator", "--listen=127.0.0.1:0",
      "--model=" + model, absl::StrCat("--heartbeat_ms=", options.heartbeat_ms),
      absl::StrCat("--lease_ttl_ms=", options.lease_ttl_ms)};
  if (options.http) argv.push_back("--http_listen=127.0.0.1:0");
  argv.insert(argv.end(), options.coordinator_flags.begin(),
              options.coordinator_flags.end());
  auto coordinator = ChildProcess::Spawn(argv, absl::Seconds(30));
  if (!coordinator.ok()) return coordinator.status();
  cluster->coordinator_ = std::move(*coordinator);
  auto address = ListeningAddress(cluster->coordinator_->first_line());
  if (!address.ok()) return address.status();
  cluster->address_ = *address;
  if (options.http) {
    auto http = HttpAddress(cluster->coordinator_->pid(), cluster->address_);
    if (!http.ok()) return http.status();
    cluster->http_address_ = *http;
  }
  cluster->baton_ = v1::Baton::NewStub(grpc::CreateChannel(
      cluster->address_, grpc::InsecureChannelCredentials()));

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
    auto child = ChildProcess::Start(
        {BinaryDir() + "/baton-worker", "--role=" + roles[i],
         "--listen=127.0.0.1:0", "--kv_listen=127.0.0.1:0", "--model=" + model,
         absl::StrCat("--threads=", options.threads),
         absl::StrCat("--kv_cache_mib=", mib),
         "--coordinator=" + cluster->address_});
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
    worker.stub = v1::Worker::NewStub(grpc::CreateChannel(
        worker.address, grpc::InsecureChannelCredentials()));
    cluster->workers_.push_back(std::move(worker));
  }
  if (options.wait_healthy) {
    absl::Status healthy =
        cluster->WaitHealthy(static_cast<int>(roles.size()), absl::Seconds(30));
    if (!healthy.ok()) return healthy;
  }
  return cluster;
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
  for (auto& [name, process] : running) process->Signal(SIGTERM);
  absl::Status result;
  for (auto& [name, process] : running) {
    absl::StatusOr<int> status = process->Wait(absl::Seconds(10));
    if (!status.ok()) {
      process->Signal(SIGKILL);
      result.Update(absl::DeadlineExceededError(
          absl::StrCat(name, " did not stop within 10 s of SIGTERM")));
    } else if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
      result.Update(absl::InternalError(
          absl::StrCat(name, " ended with wait status ", *status,
                       WIFSIGNALED(*status)
                           ? absl::StrCat(" (signal ", WTERMSIG(*status), ")")
                           : "")));
    }
  }
  return result;
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

}  // namespace baton::testing
