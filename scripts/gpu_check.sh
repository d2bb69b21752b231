#!/usr/bin/env bash
# The GPU check: every CUDA test and the GPU benchmarks on one GPU machine,
# with full logs in $OUT and a short table printed last (docs/gpu.md).
#
# The GPU machine has the CUDA toolkit, CMake and ninja but none of Baton's
# Debian packages (Abseil, gRPC, GoogleTest, ...) and no network, so the
# binaries are built here and carried there:
#
#   scripts/gpu_check.sh --pack      on the build machine: builds the CUDA
#       targets in $BATON_GPU_BUILD (default build-gpu/) and writes gpu-bundle/ (stripped test and bench
#       binaries, every shared library they load except the CUDA ones, and
#       the dynamic loader, so they run whatever the GPU machine's glibc) and
#       the default model split in two (gpu-model-a/, and gpu-model-b/ beside
#       the bundle), because one call carries at most 64 MiB.
#   scripts/gpu_check.sh --stash-model-part   on the GPU machine, first call
#       (carry gpu-model-a): keeps the model's first part in /tmp/baton-gpu.
#   scripts/gpu_check.sh             on the GPU machine, second call (carry
#       gpu-bundle and gpu-model-b): joins the model, runs everything. When
#       those two and the tree pass the 64 MiB a call carries, stash
#       gpu-model-b too (--stash-model-part) and carry gpu-bundle alone.
#
# Without a device every GPU test reports SKIPPED and the benchmarks say so;
# the table then says that nothing ran.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
BUNDLE="$ROOT/gpu-bundle"
STASH=/tmp/baton-gpu
# Test binaries (path under the build dir) and the benchmarks.
TESTS=(kernels/cuda/cuda_elementwise_test kernels/cuda/cuda_paged_attention_test
  kernels/cuda/cuda_gemm_test kernels/cuda/cuda_sampling_test
  worker/cuda/cuda_model_runner_test worker/cuda/cuda_engine_runner_test
  worker/transport/cuda_ipc_kv_gpu_test
  worker/transport/nccl_self_send_test worker/transport/nccl_kv_transport_test)
BENCHES=(bin/cuda_forward_bench)
# Started by cuda_ipc_kv_gpu_test as the receiving process; the cluster
# binaries for the 1P1D smoke run (CPU workers, then GPU workers).
# Limits per test binary, benchmark and cluster run, sized so one device call
# of a few minutes holds the whole check (a GPU runs each in seconds).
TEST_TIMEOUT_S="${BATON_GPU_TEST_TIMEOUT_S:-150}"
BENCH_TIMEOUT_S="${BATON_GPU_BENCH_TIMEOUT_S:-150}"
CLUSTER_TIMEOUT_S="${BATON_GPU_CLUSTER_TIMEOUT_S:-90}"
HELPERS=(worker/transport/cuda_ipc_kv_probe bin/baton-coordinator
  bin/baton-worker bin/baton)

pack() {
  local build="${BATON_GPU_BUILD:-$ROOT/build-gpu}"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DBATON_CUDA=ON >/dev/null || exit 1
  local targets=()
  for t in "${TESTS[@]}" "${BENCHES[@]}" "${HELPERS[@]}"; do
    targets+=("$(basename "$t")")
  done
  cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" || exit 1
  rm -rf "$BUNDLE" gpu-model-a gpu-model-b
  mkdir -p "$BUNDLE/bin" "$BUNDLE/lib" gpu-model-a gpu-model-b
  for t in "${TESTS[@]}" "${BENCHES[@]}" "${HELPERS[@]}"; do
    strip --strip-debug -o "$BUNDLE/bin/$(basename "$t")" "$build/$t" || exit 1
  done
  # Shared libraries: all but the driver's and the CUDA toolkit's (the GPU
  # machine has its own, matching its driver), loader included.
  for b in "$BUNDLE"/bin/*; do
    ldd "$b" | awk '/=>/ {print $3} /ld-linux/ {print $1}'
  done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libcuda.so* | libcudart.so* | libcublas*.so* | libnccl.so* | linux-vdso*) ;;
      *) [[ -f "$lib" ]] && cp -L "$lib" "$BUNDLE/lib/" ;;
    esac
  done
  cp scripts/gpu_check.sh "$BUNDLE/"
  # Compressed, the binaries and libraries leave room for the model's second
  # part in the same call.
  tar -C "$BUNDLE" -czf "$BUNDLE/bundle.tgz" bin lib && rm -rf "${BUNDLE:?}/bin" "${BUNDLE:?}/lib"
  local model="${BATON_DEFAULT_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
  if [[ -f "$model" ]]; then
    # 56 MiB + the ~6 MB tree fits one call; the rest rides with the bundle.
    split -b 56M -d "$model" gpu-model-a/part-
    mv gpu-model-a/part-01 gpu-model-b/ 2>/dev/null
    sha256sum "$model" | awk '{print $1}' >gpu-model-b/sha256
  fi
  du -sh "$BUNDLE" gpu-model-a gpu-model-b
  echo "bundle ready: carry gpu-model-a first (--stash-model-part), then gpu-bundle and gpu-model-b"
}

# Tests whose figures (GB/s) need the GPU to themselves.
is_timed() {
  case "$1" in
    cuda_ipc_kv_gpu_test | nccl_self_send_test | nccl_kv_transport_test) return 0 ;;
    *) return 1 ;;
  esac
}

# Directories holding the GPU machine's CUDA libraries (toolkit, or the
# Python wheels' nvidia/*/lib).
cuda_lib_path() {
  local dirs=(/usr/local/cuda/lib64 /usr/local/cuda/lib)
  local py
  py="$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null)"
  [[ -n "$py" ]] && dirs+=("$py"/nvidia/*/lib)
  local IFS=:
  echo "${dirs[*]}"
}

# A local 1P1D cluster (scripts/local_cluster.sh) answering one greedy
# prompt, with CPU workers and then with both workers on GPU 0 (KV over CUDA
# IPC); the answers and the logs go to $out/cluster-*.
cluster_smoke() {  # out loader libpath model
  local out="$1" loader="$2" libpath="$3" model="$4"
  local wrap="$STASH/wrap"
  mkdir -p "$wrap"
  for b in baton-coordinator baton-worker baton; do
    printf '#!/bin/sh\nexec "%s" --library-path "%s" "%s" "$@"\n' "$loader" \
      "$libpath" "$BUNDLE/bin/$b" >"$wrap/$b"
    chmod +x "$wrap/$b"
  done
  for dev in cpu cuda:0; do
    local tag="cluster-${dev/:/}"
    echo "== 1P1D cluster, --device=$dev"
    # shellcheck disable=SC2016  # $0, $1 and $BATON_SERVER: sh -c's own
    timeout "$CLUSTER_TIMEOUT_S" "$ROOT/scripts/local_cluster.sh" 1P1D --no-build --bin="$wrap" \
      --device="$dev" --model="$model" --logs="$out/$tag" -- sh -c \
      '"$0" generate --server="$BATON_SERVER" --prompt="$1" --max_tokens=24' \
      "$wrap/baton" "What is the capital of France?" >"$out/$tag.txt" \
      2>"$out/$tag.log"
    echo "   exit $?"
    tail -3 "$out/$tag.log" | sed 's/^/   /'
    sed 's/^/   /' "$out/$tag.txt"
  done
}

run_all() {
  local out="${OUT:-/tmp/gpu_check_out}"
  mkdir -p "$out" "$STASH"
  if [[ -f "$BUNDLE/bundle.tgz" ]]; then
    rm -rf "$STASH/bundle" && mkdir -p "$STASH/bundle"
    tar -C "$STASH/bundle" -xzf "$BUNDLE/bundle.tgz" || return 1
    BUNDLE="$STASH/bundle"
  fi
  local model="$STASH/model.gguf"
  if [[ -f gpu-model-b/part-01 && -f "$STASH/part-00" ]]; then
    cat "$STASH/part-00" gpu-model-b/part-01 >"$model"
  elif [[ -f "$STASH/part-01" && -f "$STASH/part-00" ]]; then
    cat "$STASH/part-00" "$STASH/part-01" >"$model"
  elif [[ -f gpu-model-a/part-00 && ! -f gpu-model-b/part-01 ]]; then
    cp gpu-model-a/part-00 "$model"
  fi
  local sum=gpu-model-b/sha256
  [[ -f "$sum" ]] || sum="$STASH/sha256"
  if [[ -f "$sum" && -f "$model" ]]; then
    [[ "$(sha256sum "$model" | awk '{print $1}')" == "$(cat "$sum")" ]] ||
      echo "WARNING: the joined model's sha256 differs; whole-model results are void"
  fi
  [[ -f "$model" ]] && export BATON_DEFAULT_MODEL="$model"
  export BATON_SOURCE_DIR="$ROOT"
  local loader="$BUNDLE/lib/ld-linux-x86-64.so.2"
  local libpath
  libpath="$BUNDLE/lib:$(cuda_lib_path)"
  # The probe runs through the carried loader too.
  printf '#!/bin/sh\nexec "%s" --library-path "%s" "%s" "$@"\n' "$loader" \
    "$libpath" "$BUNDLE/bin/cuda_ipc_kv_probe" >"$STASH/probe.sh"
  chmod +x "$STASH/probe.sh"
  export BATON_CUDA_IPC_PROBE="$STASH/probe.sh"
  {
    echo "date: $(date -u +%F' '%TZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  } | tee "$out/device.txt"
  # The correctness tests run side by side (one GPU has room for all of
  # them); the ones that print a bandwidth, and the benchmark, run alone.
  local status=0 names=() pids=()
  run_test() {  # name
    timeout "$TEST_TIMEOUT_S" "$loader" --library-path "$libpath" \
      "$BUNDLE/bin/$1" --gtest_color=no >"$out/$1.log" 2>&1
    echo $? >"$out/$1.rc"
  }
  for t in "${TESTS[@]}"; do
    names+=("$(basename "$t")")
    is_timed "${names[-1]}" || { run_test "${names[-1]}" & pids+=($!); }
  done
  wait "${pids[@]}"
  for name in "${names[@]}"; do
    is_timed "$name" && run_test "$name"
  done
  for name in "${names[@]}"; do
    local rc
    rc="$(cat "$out/$name.rc")"
    [[ $rc -ne 0 ]] && status=1
    echo "== $name"
    grep -E '^\[  (PASSED|FAILED|SKIPPED) |tests? ran' "$out/$name.log" | tail -4
    echo "   exit $rc"
  done
  for b in "${BENCHES[@]}"; do
    local name
    name="$(basename "$b")"
    echo "== $name"
    timeout "$BENCH_TIMEOUT_S" "$loader" --library-path "$libpath" "$BUNDLE/bin/$name" \
      >"$out/$name.log" 2>&1
    echo "   exit $?"
  done
  [[ -f "$model" ]] && cluster_smoke "$out" "$loader" "$libpath" "$model"
  echo
  echo "---- per-kernel max error (atol/rtol = the test's tolerance) ----"
  cat "$out"/*_test.log | grep -h '^BATON_KERNEL_ERROR' |
    awk '{op=""; mx=0; tol="";
          for (i = 2; i <= NF; ++i) {
            split($i, kv, "=");
            if (kv[1] == "op") op = kv[2];
            if (kv[1] == "max_abs" && kv[2] + 0 >= mx) mx = kv[2] + 0;
            if (kv[1] == "atol") tol = kv[2];
          }
          if (!(op in worst) || mx > worst[op]) { worst[op] = mx; at[op] = tol }
          seen[op] = 1}
         END {for (op in seen) printf "%-28s max_abs %-12g atol %s\n", op, worst[op], at[op]}' |
    sort
  echo "---- benchmarks ----"
  sed -n '/^case /,$p' "$out/cuda_forward_bench.log"
  grep -h -E '^(BATON_KV_GBPS|BATON_KV_COPY_GBPS)' "$out"/*.log ||
    echo "(no KV transfer figures: see the logs)"
  echo "---- 1P1D cluster answers (greedy) ----"
  for f in "$out"/cluster-*.txt; do
    [[ -f "$f" ]] && printf '%s: %s\n' "$(basename "$f" .txt)" "$(grep -v '^[0-9.]*:[0-9]*$' "$f" | head -c 300 | tr '\n' ' ')"
  done
  if ! grep -q -h '^BATON_KERNEL_ERROR' "$out"/*_test.log 2>/dev/null; then
    echo "NOTHING RAN ON A GPU: every kernel test was skipped (see $out/*.log)"
  fi
  return $status
}

case "${1:-}" in
  --pack) pack ;;
  --stash-model-part)
    # Whichever parts this call carried (gpu-model-a, gpu-model-b or both).
    mkdir -p "$STASH" && cp gpu-model-a/part-00 gpu-model-b/part-01 gpu-model-b/sha256 "$STASH/" 2>/dev/null
    ls -la "$STASH" ;;
  "") run_all ;;
  *) echo "usage: scripts/gpu_check.sh [--pack | --stash-model-part]" >&2; exit 2 ;;
esac
