#!/usr/bin/env bash
# Sets up what is missing and builds Baton (Release with line tables) into
# build/: every target, or only the named ones.
#   scripts/build.sh                      everything (tools, tests, benchmarks)
#   scripts/build.sh baton-coordinator baton-worker baton   the cluster only
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
if [[ $# -gt 0 ]]; then
  cmake --build build -j "${BATON_JOBS:-$(nproc)}" --target "$@"
else
  cmake --build build -j "${BATON_JOBS:-$(nproc)}"
fi
