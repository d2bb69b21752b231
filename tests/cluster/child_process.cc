#include "tests/cluster/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

extern char** environ;

namespace baton::testing {

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Spawn(
    const std::vector<std::string>& argv, absl::Duration ready_timeout) {
  if (argv.empty()) return absl::InvalidArgumentError("argv is empty");
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::unique_ptr<ChildProcess> child(new ChildProcess());
  const int error = posix_spawn(&child->pid_, argv[0].c_str(), &actions,
                                nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  if (error != 0) {
    close(pipe_fds[0]);
    child->exit_status_ = 0;
    return absl::InternalError(
        absl::StrCat("spawn ", argv[0], ": ", std::strerror(error)));
  }
  child->stdout_fd_ = pipe_fds[0];
  const absl::Time deadline = absl::Now() + ready_timeout;
  while (child->first_line_.find('\n') == std::string::npos) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("'", absl::StrJoin(argv, " "), "' printed no line in ",
                       absl::FormatDuration(ready_timeout)));
    }
    pollfd pfd{child->stdout_fd_, POLLIN, 0};
    const int ready =
        poll(&pfd, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready <= 0) continue;
    char buffer[512];
    const ssize_t n = read(child->stdout_fd_, buffer, sizeof(buffer));
    if (n <= 0) {
      auto status = child->Wait(absl::Seconds(5));
      return absl::InternalError(absl::StrCat(
          "'", absl::StrJoin(argv, " "), "' exited before it was ready (",
          status.ok() ? absl::StrCat("wait status ", *status)
                      : std::string(status.status().message()),
          ")"));
    }
    child->first_line_.append(buffer, static_cast<size_t>(n));
  }
  child->first_line_.resize(child->first_line_.find('\n'));
  return child;
}

ChildProcess::~ChildProcess() {
  if (running() && pid_ > 0) {
    kill(pid_, SIGKILL);
    Wait(absl::Seconds(10)).IgnoreError();
  }
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

void ChildProcess::Signal(int signal) {
  if (running() && pid_ > 0) kill(pid_, signal);
}

absl::StatusOr<int> ChildProcess::Wait(absl::Duration timeout) {
  if (exit_status_.has_value()) return *exit_status_;
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exit_status_ = status;
      return status;
    }
    if (r < 0) {
      exit_status_ = -1;
      return absl::InternalError(
          absl::StrCat("waitpid: ", std::strerror(errno)));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid_, " still running"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace baton::testing
