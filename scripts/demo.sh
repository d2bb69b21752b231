#!/usr/bin/env bash
# The main job on a fresh machine: set up, build, and run the default model.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/build.sh"
"$ROOT/build/bin/baton" inspect --model="$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf"
