// A child process for tests: spawned with its stdout on a pipe (the first
// line announces where it listens), stderr inherited. Killed (SIGKILL) and
// reaped on destruction if still running.
#ifndef BATON_TESTS_CLUSTER_CHILD_PROCESS_H_
#define BATON_TESTS_CLUSTER_CHILD_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace baton::testing {

class ChildProcess {
 public:
  // Starts argv[0] (a path) with argv and waits up to `ready_timeout` for
  // the first line of its stdout, returned by first_line(). DeadlineExceeded
  // or Internal (with the exit status) if it does not come. The child is
  // killed when the calling THREAD exits (PR_SET_PDEATHSIG), so spawn from
  // a thread that outlives it.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(
      const std::vector<std::string>& argv, absl::Duration ready_timeout);
  // Spawn without waiting; then WaitForFirstLine.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(
      const std::vector<std::string>& argv);
  absl::Status WaitForFirstLine(absl::Duration timeout);
  // The next stdout line (after first_line() and lines already returned)
  // that starts with `prefix`, without its newline; other lines are
  // skipped. DeadlineExceeded, or Internal if the process closes stdout.
  absl::StatusOr<std::string> WaitForLine(absl::string_view prefix,
                                          absl::Duration timeout);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& first_line() const { return first_line_; }
  bool running() const { return !exit_status_.has_value(); }

  // Sends `signal` (no-op once reaped).
  void Signal(int signal);
  // Waits up to `timeout` for the process to exit; its wait status, or
  // DeadlineExceeded.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // Whether the process has stopped (SIGSTOP, e.g. a fault point's stop
  // action) since it last ran; reports each stop once. An exit seen here is
  // recorded as Wait would.
  bool PollStopped();

 private:
  ChildProcess() = default;
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string command_;  // for messages
  // Reads what stdout has until `deadline`; false and `error` set if it
  // ends (the process closed it) or the deadline passes with nothing read.
  bool ReadMore(absl::Time deadline, absl::string_view waiting_for,
                absl::Status* error);

  std::string first_line_;
  std::string pending_;  // stdout bytes read but not yet returned as lines
  std::optional<int> exit_status_;
};

}  // namespace baton::testing

#endif  // BATON_TESTS_CLUSTER_CHILD_PROCESS_H_
