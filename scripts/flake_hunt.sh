#!/usr/bin/env bash
# Repeats the timing-sensitive tests (ctest labels `sanitize` and `timing`:
# the cluster, fault, transport, HTTP and coordinator tests; `sanitize` alone
# in a sanitizer tree, as scripts/test.sh runs it) under `ctest -j2`
# as CI runs them, and prints a table of runs and failures per test.
#
#   scripts/flake_hunt.sh [N] [options]
#     N                 rounds for tests that take under 10 s (default 20);
#                       longer tests run max(1, N/4) rounds (5 of 20)
#     --build=DIR       the build tree to test (default build; e.g.
#                       build-address, build-thread)
#     --slow=MODE       none (default); hog: one busy loop pinned to each
#                       core keeps every core busy (a steady slowdown: a
#                       process pinned to a core gets half of it); quota:
#                       the tests run in a cgroup limited to half the
#                       machine's CPU time (cgroup v1 or v2)
#     --regex=RE        only tests whose names match RE
#     --exclude=RE      leave out tests whose names match RE
#
# Needs a built tree (scripts/test.sh, or cmake --build DIR). Sanitizer trees
# need the same ASAN_OPTIONS / TSAN_OPTIONS as scripts/test.sh; they are set
# here. Exit status 1 if any run failed. The table is also written to
# DIR/flake_hunt.txt, with each failing run's output under DIR/flake_hunt/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROUNDS=20
BUILD=build
SLOW=none
REGEX=""
EXCLUDE=""
for arg in "$@"; do
  case "$arg" in
    --build=*) BUILD="${arg#--build=}" ;;
    --slow=*) SLOW="${arg#--slow=}" ;;
    --regex=*) REGEX="${arg#--regex=}" ;;
    --exclude=*) EXCLUDE="${arg#--exclude=}" ;;
    [0-9]*) ROUNDS="$arg" ;;
    *) echo "flake_hunt.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done
case "$SLOW" in none|hog|quota) ;; *)
  echo "flake_hunt.sh: --slow must be none, hog or quota, got '$SLOW'" >&2; exit 2 ;;
esac
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"
if [ ! -f "$BUILD/CTestTestfile.cmake" ]; then
  echo "flake_hunt.sh: $BUILD is not a built tree (run scripts/test.sh first)" >&2
  exit 2
fi
LONG_ROUNDS=$(( ROUNDS / 4 > 0 ? ROUNDS / 4 : 1 ))

export ASAN_OPTIONS="detect_leaks=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export TSAN_OPTIONS="halt_on_error=1:ignore_noninstrumented_modules=1:suppressions=$ROOT/common/tsan/grpc.supp"

OUT="$BUILD/flake_hunt"
rm -rf "$OUT"
mkdir -p "$OUT"

cleanup() {
  if [ "${#HOGS[@]}" -gt 0 ]; then kill "${HOGS[@]}" 2>/dev/null || true; fi
  if [ -n "${CGROUP:-}" ] && [ -d "$CGROUP" ]; then
    rmdir "$CGROUP" 2>/dev/null || true
  fi
}
trap cleanup EXIT

# Runs "$@" (a ctest command) under the chosen slowdown.
RUNNER=()
HOGS=()
case "$SLOW" in
  hog)
    for cpu in $(seq 0 $(( $(nproc) - 1 ))); do
      taskset -c "$cpu" bash -c 'while :; do :; done' &
      HOGS+=("$!")
    done
    ;;
  quota)
    period=100000
    quota=$(( period * $(nproc) / 2 ))
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
      CGROUP=/sys/fs/cgroup/baton-flake-hunt-$$
      mkdir "$CGROUP"
      echo "$quota $period" > "$CGROUP/cpu.max"
    else
      CGROUP=/sys/fs/cgroup/cpu/baton-flake-hunt-$$
      mkdir "$CGROUP"
      echo "$period" > "$CGROUP/cpu.cfs_period_us"
      echo "$quota" > "$CGROUP/cpu.cfs_quota_us"
    fi
    # shellcheck disable=SC2016  # expanded by the inner shell
    RUNNER=(bash -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$CGROUP")
    ;;
esac

# A sanitizer tree holds only what scripts/test.sh builds there, and CI
# runs its `sanitize` tests alone; the main tree runs `timing` ones too.
labels='sanitize|timing'
sanitizer=$(sed -n 's/^BATON_SANITIZE:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
if [ -n "$sanitizer" ] && [ "$sanitizer" != OFF ]; then
  labels='sanitize'
fi
ctest_args=(-L "$labels")
[ -n "$REGEX" ] && ctest_args+=(-R "$REGEX")
[ -n "$EXCLUDE" ] && ctest_args+=(-E "$EXCLUDE")

# Round 1 runs every selected test and measures each; later rounds repeat
# the short ones (< 10 s) every round and the long ones LONG_ROUNDS times.
declare -A runs fails secs
run_round() {  # round number, ctest filter arguments...
  local round="$1"
  shift
  local log="$OUT/round-$round.log"
  (cd "$BUILD" && "${RUNNER[@]}" ctest -j2 --output-on-failure "${ctest_args[@]}" "$@") \
    > "$log" 2>&1 || true
  # "  3/41 Test  #7: Suite.Name ....   Passed    1.23 sec" (a parameterized
  # test's name is followed by "  # GetParam() = ...")
  while read -r name verdict t; do
    runs[$name]=$(( ${runs[$name]:-0} + 1 ))
    if [ "$verdict" != Passed ]; then
      fails[$name]=$(( ${fails[$name]:-0} + 1 ))
      cp "$log" "$OUT/fail-$round-${name//\//_}.log"
    fi
    if [ -z "${secs[$name]:-}" ] || awk "BEGIN{exit !($t > ${secs[$name]})}"; then
      secs[$name]=$t
    fi
  done < <(sed -nE 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) .*\.\.\.[* ]*([A-Za-z]+)[^0-9]* ([0-9.]+) sec$/\1 \2 \3/p' "$log")
}

echo "flake_hunt: $("$ROOT/scripts/host_info.sh"); tree $BUILD; slowdown $SLOW;" \
     "$ROUNDS rounds (long tests $LONG_ROUNDS)"
echo "flake_hunt: round 1 of $ROUNDS (all selected tests)"
run_round 1
short=() long=()
for name in "${!runs[@]}"; do
  if awk "BEGIN{exit !(${secs[$name]} < 10)}"; then short+=("$name"); else long+=("$name"); fi
done
for (( round = 2; round <= ROUNDS; ++round )); do
  selected=("${short[@]}")
  (( round <= LONG_ROUNDS )) && selected+=("${long[@]}")
  [ "${#selected[@]}" -eq 0 ] && break
  echo "flake_hunt: round $round of $ROUNDS (${#selected[@]} tests)"
  regex="^($(IFS='|'; echo "${selected[*]}"))( |\$)"
  run_round "$round" -R "$regex"
done

table="$BUILD/flake_hunt.txt"
{
  printf '%-72s %5s %6s %8s\n' test runs failed max_s
  total_fail=0
  for name in $(printf '%s\n' "${!runs[@]}" | sort); do
    printf '%-72s %5d %6d %8s\n' "$name" "${runs[$name]}" "${fails[$name]:-0}" "${secs[$name]}"
    total_fail=$(( total_fail + ${fails[$name]:-0} ))
  done
  echo "total: ${#runs[@]} tests, $total_fail failed runs"
} | tee "$table"
grep -q ' 0 failed runs$' "$table"
