#include "tests/cluster/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

extern char** environ;

namespace baton::testing {

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Spawn(
    const std::vector<std::string>& argv, absl::Duration ready_timeout) {
  auto child = Start(argv);
  if (!child.ok()) return child.status();
  if (absl::Status s = (*child)->WaitForFirstLine(ready_timeout); !s.ok()) {
    return s;
  }
  return child;
}

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::vector<std::string>& argv) {
  if (argv.empty()) return absl::InvalidArgumentError("argv is empty");
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::unique_ptr<ChildProcess> child(new ChildProcess());
  const pid_t parent = getpid();
  child->pid_ = fork();
  if (child->pid_ == 0) {
    // Only async-signal-safe calls until exec. The child dies with the
    // test, so a crashed or killed test leaves no process behind.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(pipe_fds[1], STDOUT_FILENO);
    execve(args[0], args.data(), environ);
    _exit(127);
  }
  close(pipe_fds[1]);
  if (child->pid_ < 0) {
    close(pipe_fds[0]);
    child->exit_status_ = 0;
    return absl::InternalError(
        absl::StrCat("fork for ", argv[0], ": ", std::strerror(errno)));
  }
  child->stdout_fd_ = pipe_fds[0];
  child->command_ = absl::StrJoin(argv, " ");
  return child;
}

bool ChildProcess::ReadMore(absl::Time deadline, absl::string_view waiting_for,
                            absl::Status* error) {
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      *error = absl::DeadlineExceededError(
          absl::StrCat("'", command_, "' printed no ", waiting_for));
      return false;
    }
    pollfd pfd{stdout_fd_, POLLIN, 0};
    const int ready =
        poll(&pfd, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready <= 0) continue;
    char buffer[512];
    const ssize_t n = read(stdout_fd_, buffer, sizeof(buffer));
    if (n <= 0) {
      auto status = Wait(absl::Seconds(5));
      *error = absl::InternalError(
          absl::StrCat("'", command_, "' closed its output before it printed ",
                       waiting_for, " (",
                       status.ok() ? absl::StrCat("wait status ", *status)
                                   : std::string(status.status().message()),
                       ")"));
      return false;
    }
    pending_.append(buffer, static_cast<size_t>(n));
    return true;
  }
}

absl::Status ChildProcess::WaitForFirstLine(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status error;
  while (pending_.find('\n') == std::string::npos) {
    if (!ReadMore(deadline, "line", &error)) return error;
  }
  const size_t end = pending_.find('\n');
  first_line_ = pending_.substr(0, end);
  pending_.erase(0, end + 1);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ChildProcess::WaitForLine(absl::string_view prefix,
                                                      absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const std::string what = absl::StrCat("line starting '", prefix, "'");
  absl::Status error;
  for (;;) {
    size_t end;
    while ((end = pending_.find('\n')) != std::string::npos) {
      std::string line = pending_.substr(0, end);
      pending_.erase(0, end + 1);
      if (absl::StartsWith(line, prefix)) return line;
    }
    if (!ReadMore(deadline, what, &error)) return error;
  }
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

bool ChildProcess::PollStopped() {
  if (exit_status_.has_value()) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG | WUNTRACED);
  if (r == pid_ && WIFSTOPPED(status)) return true;
  if (r == pid_) exit_status_ = status;
  if (r < 0) exit_status_ = -1;
  return false;
}

}  // namespace baton::testing
