// Helpers for tests: the environment ctest sets (see baton_test in the
// top-level CMakeLists.txt) and running a reference script.
#ifndef BATON_COMMON_TEST_UTIL_H_
#define BATON_COMMON_TEST_UTIL_H_

#include <string>

#include "absl/status/statusor.h"

namespace baton::testing {

// $BATON_DEFAULT_MODEL, the default model's GGUF path.
std::string DefaultModelPath();
// $BATON_SOURCE_DIR, the repository root.
std::string SourceDir();
// $BATON_PYTHON, the venv python with the reference packages.
std::string PythonPath();

// Runs `command` with /bin/sh and returns its stdout; Internal error with the
// exit status if it fails.
absl::StatusOr<std::string> RunCommand(const std::string& command);

}  // namespace baton::testing

#endif  // BATON_COMMON_TEST_UTIL_H_
