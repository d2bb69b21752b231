#include "common/test_util.h"

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace baton::testing {
namespace {

// common/test_env.cc sets these before main() in every test binary.
std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

}  // namespace

std::string DefaultModelPath() { return Env("BATON_DEFAULT_MODEL"); }
std::string SourceDir() { return Env("BATON_SOURCE_DIR"); }
std::string PythonPath() { return Env("BATON_PYTHON"); }

absl::StatusOr<std::string> RunCommand(const std::string& command) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    return absl::InternalError(absl::StrCat("cannot run: ", command));
  }
  std::string out;
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    out.append(buffer, n);
  }
  int status = ::pclose(pipe);
  if (status != 0) {
    return absl::InternalError(absl::StrCat(
        "command failed (exit ", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
        "): ", command));
  }
  return out;
}

}  // namespace baton::testing
