#!/usr/bin/env bash
# Lints what deploy/ ships: both Dockerfiles with hadolint, every shell
# script (entrypoint, Slurm batch script, tests, and those of scripts/)
# with the shell linter, and the Python scripts by compiling them.
#   tests/deploy/lint.sh DEPLOY_VENV
# Exit status 77 (a skip) when the tools are not installed
# (scripts/setup.sh --deploy).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$1"
if [ ! -x "$VENV/bin/hadolint" ] || ! command -v shellcheck >/dev/null; then
  echo "lint: SKIP: hadolint ($VENV) or shellcheck missing (scripts/setup.sh --deploy)"
  exit 77
fi
cd "$ROOT"
"$VENV/bin/hadolint" deploy/docker/Dockerfile deploy/docker/Dockerfile.gpu
mapfile -t scripts < <(find deploy tests/deploy tests/netns scripts -type f \( -name '*.sh' -o -name '*.sbatch' \) | sort)
shellcheck -x "${scripts[@]}"
mapfile -t pythons < <(find deploy tests/deploy -type f -name '*.py' | sort)
"$VENV/bin/python" -m py_compile "${pythons[@]}"
echo "lint: ok (2 Dockerfiles, ${#scripts[@]} shell scripts, ${#pythons[@]} Python files)"
