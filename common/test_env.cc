// Linked into every baton_test binary: before main(), sets BATON_DEFAULT_MODEL,
// BATON_SOURCE_DIR and BATON_PYTHON to this build's values unless the
// environment already names them, so a test binary run by hand behaves as
// under ctest.
#include <cstdlib>

namespace {

struct TestEnvironment {
  TestEnvironment() {
    setenv("BATON_DEFAULT_MODEL", BATON_DEFAULT_MODEL_PATH, /*overwrite=*/0);
    setenv("BATON_SOURCE_DIR", BATON_SOURCE_DIR_PATH, 0);
    setenv("BATON_PYTHON", BATON_PYTHON_PATH, 0);
  }
};

const TestEnvironment kTestEnvironment;

}  // namespace
