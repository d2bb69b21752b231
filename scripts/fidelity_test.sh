#!/usr/bin/env bash
# The small fidelity case of scripts/fidelity.py, with the binaries in
# BIN_DIR: bad options fail before any cluster starts; then a quick profile
# of this host's 1P1D cluster, its saturation throughput and a point at half
# of it, each measured and simulated from the same requests; the simulated
# saturation throughput must be within 5% of the measured one and the
# goodput within 15%.
#
#   scripts/fidelity_test.sh BIN_DIR
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:?usage: fidelity_test.sh BIN_DIR}"
PYTHON=python3  # fidelity.py needs the standard library only
OUT="$(mktemp -d /tmp/fidelity-test.XXXXXX)"
trap 'rm -rf "$OUT"' EXIT
fail() { echo "fidelity_test: FAIL: $*" >&2; exit 1; }
FIDELITY=("$PYTHON" "$ROOT/scripts/fidelity.py" --bin="$BIN")

# shellcheck source=scripts/test_lib.sh
source "$ROOT/scripts/test_lib.sh"
bad() {  # want, options...
  expect_usage_error "$1" "$OUT/bad/profile.json" -- \
    "${FIDELITY[@]}" --out="$OUT/bad" "${@:2}"
}
bad "is not a fraction of capacity" --loads=1.5
bad "'p99' is not one of" --check=p99
bad "must be positive" --num_prompts=0
echo "fidelity_test: bad options rejected" >&2

"${FIDELITY[@]}" --quick_profile --shapes=1P1D --loads=0.5 --seeds=0 \
  --num_prompts=12 --saturation_prompts=16 --input_len=192 --output_len=48 \
  --goodput="ttft:4000 tpot:60" --check=saturation,goodput --out="$OUT/run" ||
  fail "fidelity.py exited $?"
for f in profile.json points-1P1D.json fidelity.md fidelity.json; do
  [[ -s "$OUT/run/$f" ]] || fail "missing $f"
done
grep -q "| 1P1D | 50% |" "$OUT/run/fidelity.md" || fail "no 1P1D row"
echo "fidelity_test: passed" >&2
