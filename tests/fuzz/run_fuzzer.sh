#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time from a fresh copy of its seeds.
#   run_fuzzer.sh BINARY SEED_DIR SECONDS
# Exits non-zero (and libFuzzer prints the crashing input) on any crash,
# sanitizer report, leak or timeout of a single input.
set -euo pipefail
binary="$1" seeds="$2" seconds="$3"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus"
if [ -d "$seeds" ]; then cp -r "$seeds"/. "$work/corpus/"; fi
cd "$work"
status=0
"$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 corpus >log 2>&1 || status=$?
if [ "$status" -ne 0 ]; then
  cat log
  echo "fuzz: $(basename "$binary") FAILED (exit $status)"
  exit "$status"
fi
runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' log | grep -o '[0-9]*$')
echo "fuzz: $(basename "$binary") ran ${runs:-?} inputs in ${seconds}s without a crash"
