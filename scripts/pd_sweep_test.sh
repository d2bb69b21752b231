#!/usr/bin/env bash
# End-to-end check of scripts/pd_sweep.sh with the binaries in BIN_DIR: bad
# options fail before any cluster starts; a small sweep over 2C and 1P1D
# writes every point, the CSV, the plots and a summary naming a shape.
#
#   scripts/pd_sweep_test.sh BIN_DIR
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:?usage: pd_sweep_test.sh BIN_DIR}"
OUT="$(mktemp -d /tmp/pd-sweep-test.XXXXXX)"
trap 'rm -rf "$OUT"' EXIT
fail() { echo "pd_sweep_test: FAIL: $*" >&2; exit 1; }
SWEEP=(bash "$ROOT/scripts/pd_sweep.sh" --no-build --bin="$BIN")

# Bad input: exit 2 with a message naming the problem, no cluster started.
# shellcheck source=scripts/test_lib.sh
source "$ROOT/scripts/test_lib.sh"
bad() {  # want, options...
  expect_usage_error "$1" "$OUT/bad/raw" -- "${SWEEP[@]}" --out="$OUT/bad" "${@:2}"
}
bad "'0' is not a positive number" --rates=1,0
bad "'-1' is not a positive number" --rates=-1
bad "does not split evenly" --shapes=2C --total_threads=3
bad "is not like 2C" --shapes=2X
bad "unknown option" --nonsense=1
echo "pd_sweep_test: bad options rejected" >&2

# A small sweep: 2 shapes x 2 rates, 4 short requests per point.
"${SWEEP[@]}" --shapes=2C,1P1D --total_threads=2 --rates=4,inf --num_prompts=4 \
  --input_len=32 --output_len=8 --warmup=1 --max_duration_s=60 \
  --goodput="ttft:60000 tpot:60000" --kv_cache_mib=32 --out="$OUT/sweep" ||
  fail "pd_sweep.sh exited $?"
for shape in 2C 1P1D; do
  for rate in 4 inf; do
    file="$OUT/sweep/raw/$shape-r$rate.json"
    [[ -s "$file" ]] || fail "missing $file"
    grep -q '"completed": 4' "$file" || fail "$file: not every request completed"
  done
done
rows="$(($(wc -l <"$OUT/sweep/points.csv") - 1))"
[[ $rows -eq 4 ]] || fail "points.csv has $rows rows, want 4"
for png in goodput.png ttft.png tpot.png; do
  head -c 8 "$OUT/sweep/$png" | grep -q PNG || fail "$png is not a PNG"
done
# Generous SLOs: every request is good, so both shapes reach the top rate.
grep -Eq '^\| inf \| \*\*(2C|1P1D)\*\*' "$OUT/sweep/summary.md" || fail "no recommendation at inf"
grep -q '\*\*1P1D\*\* meets the SLOs for ≥ 90% of requests up to inf req/s' "$OUT/sweep/summary.md" ||
  fail "1P1D capacity missing from the summary"
echo "pd_sweep_test: sweep report complete ($rows points)" >&2
