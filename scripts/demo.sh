#!/usr/bin/env bash
# The main job on a fresh machine: set up, build, and answer a prompt with the
# default model (in-process engine; the cluster version follows the cluster).
#   scripts/demo.sh ["your prompt"]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/build.sh"
PROMPT="${1:-Give me three tips for staying focused while studying.}"
"$ROOT/build/bin/baton" generate --model="$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf" \
  --prompt="$PROMPT" --max_tokens=200
