#!/usr/bin/env bash
# The test command: sets up what is missing, builds Baton and its fuzz targets,
# and runs the tests with ctest (unit, reference and bounded fuzz runs); the
# concurrent part (tests labelled `sanitize`: the multi-process cluster
# suite, the worker service, KV transports, disaggregation and the
# coordinator core) runs under AddressSanitizer + UBSan and under
# ThreadSanitizer instead, each in its own smaller build (with
# BATON_SANITIZERS=none, in the main build).
#
#   scripts/test.sh                   everything (what CI runs)
#   BATON_JOBS=N scripts/test.sh      build parallelism (default: nproc)
#   BATON_SANITIZERS=none scripts/test.sh   skip the sanitizer builds
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
JOBS="${BATON_JOBS:-$(nproc)}"

# Wall time of each stage (setup, fuzz build, main build + tests, ASan, TSan;
# a sanitizer tree's build starts beside the tests of the stage before it and
# ends in its own stage), printed at the end, also when a stage fails: the
# baseline CI is held to.
STAGE_TIMES=()
STAGE_NAME=""
STAGE_START=$SECONDS
stage() {  # name of the stage that starts now ("" ends the last one)
  if [ -n "$STAGE_NAME" ]; then
    STAGE_TIMES+=("$(printf '%-10s %5d s' "$STAGE_NAME" $(( SECONDS - STAGE_START )))")
  fi
  STAGE_NAME="$1"
  STAGE_START=$SECONDS
}
report_stages() {
  local rc=$?
  stop_build
  stage ""
  echo "test.sh: $(scripts/host_info.sh); wall time per stage:"
  printf '  %s\n' "${STAGE_TIMES[@]}"
  echo "  total      $SECONDS s (exit $rc)"
}
BG_PID=""  # a sanitizer tree's build running in the background (below)
stop_build() {
  if [[ -n "$BG_PID" ]]; then
    kill "$BG_PID" 2>/dev/null || true
    wait "$BG_PID" 2>/dev/null || true
  fi
}
trap report_stages EXIT

stage setup
bash scripts/setup.sh --deploy

stage fuzz
# libFuzzer targets need clang; they are built separately and run by ctest
# for a fixed time each. -O1 -g1 (line tables for the sanitizers' reports)
# compiles them about 15% faster than -O2 -g.
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DBATON_FUZZ=ON >/dev/null
cmake --build build-fuzz -j "$JOBS"

stage main
# The tests labelled `sanitize` run in the sanitizer trees below, which
# serve as their test trees: this tree builds, of those, only the binary of
# the stand-in device runner's single-threaded token checks, which run here
# only (20-30 s each under ASan, ~90 s under TSan; its threaded
# host-staging handoff runs under both sanitizers).
DEVICE_TOKEN_CHECKS="ShadowRunnerColocatedMatchesCpu|ChunkedPrefillStagesEveryChunksLayers|SkippedStagingChangesTheTokens"
MAIN_SANITIZE_TESTS=engine_device_runner_test
if [[ "${BATON_SANITIZERS:-all}" == none ]]; then MAIN_SANITIZE_TESTS=all; fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DBATON_FUZZ_BUILD_DIR="$ROOT/build-fuzz" \
  -DBATON_SANITIZE_TESTS="$MAIN_SANITIZE_TESTS" >/dev/null
cmake --build build -j "$JOBS"

if [[ "${BATON_SANITIZERS:-all}" == none ]]; then
  (cd build && ctest --output-on-failure -j "$JOBS")
  exit 0
fi

# Each sanitizer tree builds at nice 19 beside the tests of the tree before
# it, and the rest of it after them: those tests leave a core idle much of
# the time (the multi-process cluster tests run one at a time and wait on
# their processes), and a niced compile takes only that idle time (the
# cluster tests ran about 9% longer beside one: the two cores' caches are
# shared). Linux's autogroups apply nice only within a session, so the
# build stays in this script's session (ninja puts each compile in its own
# process group, not its own session).
BG_DIR=""
BG_START=0
configure_sanitized() {  # sanitizer, compiler (gcc|clang), build dir
  local sanitizer="$1" compiler="$2" dir="$3"
  local cc=gcc cxx=g++
  if [[ "$compiler" == clang ]]; then cc=clang cxx=clang++; fi
  # -O1 -g1 compiles the instrumented gRPC/Beast-heavy code about twice as
  # fast as -O2 -g; kernels/cpu and the KV checksum keep -O2 (the tests'
  # compute runs there). Test code itself (fixtures, assertions) compiles at
  # -O0, a third faster than -O1 under the sanitizers.
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DBATON_TEST_OPT=-O0 \
    -DBATON_SANITIZE="$sanitizer" -DBATON_CUDA=OFF >/dev/null
}
start_build_beside() {  # build dir: baton_sanitize, the binaries of the
  # tests labelled `sanitize` (CMakeLists.txt), built in the background
  BG_DIR="$1"
  BG_START=$SECONDS
  nice -n 19 ninja -C "$BG_DIR" -j "$JOBS" baton_sanitize >"$BG_DIR/build.log" 2>&1 &
  BG_PID=$!
}
finish_build() {  # waits for the background build to end
  local rc=0 beside=$(( SECONDS - BG_START ))
  wait "$BG_PID" || rc=$?
  BG_PID=""
  if (( rc != 0 )); then
    tail -n 60 "$BG_DIR/build.log"
    echo "test.sh: the build of $BG_DIR failed (log: $BG_DIR/build.log)" >&2
    return "$rc"
  fi
  echo "test.sh: $BG_DIR built: $(grep -c '^\[' "$BG_DIR/build.log") steps in" \
    "$(( SECONDS - BG_START )) s, $beside s of it beside the tests before it"
}

# clang: its ASan+UBSan compiles this tree in about 480 s where GCC's took
# 620 s (UBSan's null and alignment checks are most of GCC's extra time:
# http_session.cc 35 s against 56 s), with the same tests passing.
configure_sanitized address,undefined clang build-address
start_build_beside build-address
(cd build && ctest --output-on-failure -j "$JOBS" -LE sanitize)
(cd build && ctest --output-on-failure -j "$JOBS" -R "$DEVICE_TOKEN_CHECKS")

stage asan
finish_build
# GCC for TSan: clang's TSan also instruments the gRPC callback code that
# Debian's headers inline (callback_common.h's tags, set on one gRPC thread
# and cleared on another), which grpc.supp, written for GCC's frames, does
# not cover.
configure_sanitized thread gcc build-thread
start_build_beside build-thread
export ASAN_OPTIONS="detect_leaks=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
(cd build-address && ctest --output-on-failure -j "$JOBS" -L sanitize -E "$DEVICE_TOKEN_CHECKS")

stage tsan
finish_build
# See common/tsan/: Debian's Abseil and gRPC are not built for TSan.
export TSAN_OPTIONS="halt_on_error=1:ignore_noninstrumented_modules=1:suppressions=$ROOT/common/tsan/grpc.supp"
# TSan runs 5-15x slower (though the sanitizer trees leave the engine's
# matmul tiles uninstrumented, kernels/cpu/matmul.cmake): to keep CI within its time, its cluster subset
# is client cancel, deadline expiry and the health checks; the other cluster tests run under ASan only. (Frozen and
# killed workers (the wedged one too), the killed coordinators of the restart and replica
# tests, and the coordinator drain test's frozen decode worker, also make gRPC's uninstrumented cancellation paths report races
# inside gRPC itself; so does a worker streaming to several clients at once,
# as in the elastic-membership test: gRPC's callback tags are set on one
# thread and run on another through uninstrumented code.) The HTTP cluster
# test (openai SDK, 64 streams)
# and the in-process coordinator + workers metrics test (gRPC client and
# server in one uninstrumented library) run under ASan only, as does the
# secured cluster (its TLS handshakes run in uninstrumented gRPC and
# OpenSSL; the HTTPS sessions run under both, in http_unit_test).
(cd build-thread && ctest --output-on-failure -j "$JOBS" -L sanitize -E \
  "SameTokensAsInProcessEngine|DecodePoolWithoutRoom|Malformed|EmptyPools|Orphaned|ClusterStatusLists|CoordinatorRestarts|CoordinatorDrain|Killed|Frozen|Stalled|Wedged|HttpClusterTest|CoordinatorGenerateMetrics|ClusterSecurityTest|ClusterReplicaTest|ClusterElasticTest|$DEVICE_TOKEN_CHECKS")
