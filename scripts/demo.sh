#!/usr/bin/env bash
# The main job on a fresh machine: set up what the cluster needs (no test
# tools), build the three programs it runs into build-demo/ (without CUDA
# unless BATON_DEMO_CUDA=ON), start a local 1P1D cluster (a coordinator, one
# prefill and one decode worker, KV handed over TCP on loopback), answer a
# chat prompt with the default model, print TTFT and the phase timings, and
# stop the cluster.
#   scripts/demo.sh ["your prompt"]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh --demo
cmake -S . -B build-demo -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DBATON_CUDA="${BATON_DEMO_CUDA:-OFF}" >/dev/null
cmake --build build-demo -j "${BATON_JOBS:-$(nproc)}" --target baton-coordinator baton-worker baton
PROMPT="${1:-Give me three tips for staying focused while studying.}"
# shellcheck disable=SC2016  # expanded by the inner shell
exec "$ROOT/scripts/local_cluster.sh" 1P1D --no-build --bin="$ROOT/build-demo/bin" -- sh -c \
  '"$0" generate --server="$BATON_SERVER" --prompt="$1" --max_tokens=200' \
  "$ROOT/build-demo/bin/baton" "$PROMPT"
