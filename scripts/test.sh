#!/usr/bin/env bash
# The test command: sets up what is missing, builds Baton and its fuzz targets,
# and runs every test with ctest (unit, reference and bounded fuzz runs).
#
#   scripts/test.sh            everything (what CI runs)
#   BATON_JOBS=N scripts/test.sh   build parallelism (default: nproc)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
JOBS="${BATON_JOBS:-$(nproc)}"

bash scripts/setup.sh

# libFuzzer targets need clang; they are built separately and run by ctest.
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DBATON_FUZZ=ON >/dev/null
cmake --build build-fuzz -j "$JOBS"

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DBATON_FUZZ_BUILD_DIR="$ROOT/build-fuzz" >/dev/null
cmake --build build -j "$JOBS"

cd build
ctest --output-on-failure -j "$JOBS"
