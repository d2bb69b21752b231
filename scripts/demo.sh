#!/usr/bin/env bash
# The main job on a fresh machine: set up, build, start a local 1P1D cluster
# (a coordinator, one prefill and one decode worker, KV handed over TCP on
# loopback), answer a chat prompt with the default model, print TTFT and the
# phase timings, and stop the cluster.
#   scripts/demo.sh ["your prompt"]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Only what the demo runs: the two servers and the client.
bash "$ROOT/scripts/build.sh" baton-coordinator baton-worker baton
PROMPT="${1:-Give me three tips for staying focused while studying.}"
exec "$ROOT/scripts/local_cluster.sh" 1P1D --no-build -- sh -c \
  '"$0" generate --server="$BATON_SERVER" --prompt="$1" --max_tokens=200' \
  "$ROOT/build/bin/baton" "$PROMPT"
