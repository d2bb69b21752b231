#!/usr/bin/env bash
# Compares cluster shapes on one workload: for every shape, starts a local
# cluster with the same total compute threads, runs baton-bench at every
# request rate, then writes a report folder (scripts/sweep_report.py).
#
#   scripts/pd_sweep.sh [options]
#
# Options (defaults in brackets):
#   --shapes=LIST          shapes as scripts/local_cluster.sh takes them [2C,1P1D]
#   --total_threads=N      compute threads of the whole cluster, split evenly
#                          over each shape's workers [2]
#   --rates=LIST           request rates in req/s ("inf": all at once) [0.5,1,2]
#   --input_len=N          prompt tokens (random dataset) [512]
#   --output_len=N         output tokens, enforced with ignore_eos [32]
#   --num_prompts=N        requests per point [24]
#   --max_duration_s=S     wall-clock limit of each point [300]
#   --goodput="SLOS"       SLOs in ms as baton-bench takes them
#                          ["ttft:2000 tpot:100"]
#   --kv_cache_mib=N       KV pool per worker [256]
#   --seed=N               prompts, arrivals and sampling [0]
#   --bench_cpus=LIST      pin the benchmark client (baton-bench --cpus) [none]
#   --warmup=N             requests sent to each cluster before its points [2]
#   --out=DIR              report folder [sweep-DATE]
#   --title=TEXT           report title [the workload]
#   --bin=DIR              Baton binaries [build/bin]
#   --no-build             use the existing binaries
# Every point's baton-bench JSON lands in OUT/raw/SHAPE-rRATE.json; the
# report is OUT/summary.md, OUT/points.csv and OUT/*.png; OUT/loadavg.txt
# has the host's load average at the start and end of every point.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() { sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
SHAPES=2C,1P1D TOTAL_THREADS=2 RATES=0.5,1,2 INPUT_LEN=512 OUTPUT_LEN=32
NUM_PROMPTS=24 MAX_DURATION=300 GOODPUT="ttft:2000 tpot:100" KV_MIB=256
SEED=0 BENCH_CPUS="" WARMUP=2 OUT="" TITLE="" BIN="$ROOT/build/bin" BUILD=1
POINTS_OF=""  # internal: run one shape's points inside its cluster
ARGS=("$@")
for arg in "$@"; do
  case "$arg" in
    --shapes=*) SHAPES="${arg#*=}" ;;
    --total_threads=*) TOTAL_THREADS="${arg#*=}" ;;
    --rates=*) RATES="${arg#*=}" ;;
    --input_len=*) INPUT_LEN="${arg#*=}" ;;
    --output_len=*) OUTPUT_LEN="${arg#*=}" ;;
    --num_prompts=*) NUM_PROMPTS="${arg#*=}" ;;
    --max_duration_s=*) MAX_DURATION="${arg#*=}" ;;
    --goodput=*) GOODPUT="${arg#*=}" ;;
    --kv_cache_mib=*) KV_MIB="${arg#*=}" ;;
    --seed=*) SEED="${arg#*=}" ;;
    --bench_cpus=*) BENCH_CPUS="${arg#*=}" ;;
    --warmup=*) WARMUP="${arg#*=}" ;;
    --out=*) OUT="${arg#*=}" ;;
    --title=*) TITLE="${arg#*=}" ;;
    --bin=*) BIN="${arg#*=}" ;;
    --no-build) BUILD=0 ;;
    --points_of=*) POINTS_OF="${arg#*=}" ;;
    -h|--help) usage ;;
    *) echo "pd_sweep: unknown option '$arg'" >&2; usage ;;
  esac
done
die() { echo "pd_sweep: $*" >&2; exit 2; }

# Validates everything before any cluster starts.
positive_int() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, got '$2'"; }
positive_int --total_threads "$TOTAL_THREADS"
positive_int --input_len "$INPUT_LEN"
positive_int --output_len "$OUTPUT_LEN"
positive_int --num_prompts "$NUM_PROMPTS"
positive_int --kv_cache_mib "$KV_MIB"
[[ "$WARMUP" =~ ^[0-9]+$ ]] || die "--warmup must be a count, got '$WARMUP'"
[[ "$SEED" =~ ^[0-9]+$ ]] || die "--seed must be a non-negative integer, got '$SEED'"
IFS=, read -r -a RATE_LIST <<<"$RATES"
[[ ${#RATE_LIST[@]} -gt 0 ]] || die "--rates is empty"
for rate in "${RATE_LIST[@]}"; do
  [[ "$rate" == inf ]] && continue
  if ! [[ "$rate" =~ ^[0-9]*\.?[0-9]+$ ]] ||
    ! awk "BEGIN { exit !($rate > 0) }"; then
    die "--rates: '$rate' is not a positive number or inf"
  fi
done
IFS=, read -r -a SHAPE_LIST <<<"$SHAPES"
[[ ${#SHAPE_LIST[@]} -gt 0 ]] || die "--shapes is empty"
declare -A THREADS_OF
for shape in "${SHAPE_LIST[@]}"; do
  [[ "$shape" =~ ^([0-9]+[PDC])+$ ]] || die "shape '$shape' is not like 2C, 1P1D, 2P1D"
  workers=0
  while read -r count; do workers=$((workers + count)); done < <(grep -o '[0-9]\+' <<<"$shape")
  ((workers > 0 && TOTAL_THREADS % workers == 0)) ||
    die "shape '$shape' has $workers workers; --total_threads=$TOTAL_THREADS does not split evenly"
  THREADS_OF[$shape]=$((TOTAL_THREADS / workers))
done
[[ -n "$OUT" ]] || OUT="sweep-$(date +%Y%m%d-%H%M%S)"
[[ -n "$TITLE" ]] || TITLE="random ${INPUT_LEN}-token prompts, ${OUTPUT_LEN}-token outputs"

if [[ $BUILD -eq 1 && -z "$POINTS_OF" ]]; then bash "$ROOT/scripts/build.sh" >&2; fi
PYTHON="${BATON_PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$BIN/baton-bench" ]] || die "no baton-bench in $BIN (build first, or pass --bin)"
[[ -x "$PYTHON" ]] || die "no Python at $PYTHON (run scripts/setup.sh)"
mkdir -p "$OUT/raw" "$OUT/logs"

COMMON=(--dataset-name=random --random-input-len="$INPUT_LEN" --random-output-len="$OUTPUT_LEN"
        --ignore-eos=true --seed="$SEED" --goodput="$GOODPUT")
[[ -n "$BENCH_CPUS" ]] && COMMON+=(--cpus="$BENCH_CPUS")

# Inside local_cluster.sh (BATON_SERVER set): the warm-up, then every rate.
run_points() {
  local shape="$1"
  if ((WARMUP > 0)); then
    "$BIN/baton-bench" --server="$BATON_SERVER" "${COMMON[@]}" --num-prompts="$WARMUP" \
      --max-concurrency=1 --seed=$((SEED + 1000)) >"$OUT/logs/$shape-warmup.txt" 2>&1 ||
      echo "pd_sweep: $shape warm-up failed (see $OUT/logs/$shape-warmup.txt)" >&2
  fi
  local rate status failed=0
  for rate in "${RATE_LIST[@]}"; do
    echo "pd_sweep: $shape at $rate req/s (${NUM_PROMPTS} requests;" \
      "load average $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    echo "$shape $rate start $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/loadavg.txt"
    set +e
    # Every rate sends the same seeded prompts to the same cluster: each
    # starts with empty prefix caches, or the later rates would find them.
    "$BIN/baton-bench" --server="$BATON_SERVER" "${COMMON[@]}" --num-prompts="$NUM_PROMPTS" \
      --request-rate="$rate" --max-duration-s="$MAX_DURATION" --reset-prefix-cache --save-result \
      --result-dir="$OUT/raw" --result-filename="$shape-r$rate.json" \
      >"$OUT/logs/$shape-r$rate.txt" 2>&1
    status=$?
    set -e
    echo "$shape $rate end $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/loadavg.txt"
    # 0: all completed; 3: some failed or were cut by the time limit (saved).
    if [[ $status -ne 0 && $status -ne 3 ]]; then
      echo "pd_sweep: $shape at $rate req/s: baton-bench exited $status" \
        "(see $OUT/logs/$shape-r$rate.txt)" >&2
      failed=1
    fi
    grep -E "Successful requests|Request goodput|Median TTFT|Median TPOT" \
      "$OUT/logs/$shape-r$rate.txt" | sed 's/^/    /' >&2 || true
  done
  return $failed
}
if [[ -n "$POINTS_OF" ]]; then
  [[ -n "${BATON_SERVER:-}" ]] || die "--points_of runs inside scripts/local_cluster.sh"
  run_points "$POINTS_OF"
  exit $?
fi

sweep_failed=0
for shape in "${SHAPE_LIST[@]}"; do
  threads="${THREADS_OF[$shape]}"
  echo "pd_sweep: starting $shape ($threads thread(s) per worker)" >&2
  if ! bash "$ROOT/scripts/local_cluster.sh" "$shape" --threads="$threads" \
      --kv_cache_mib="$KV_MIB" --no-build --bin="$BIN" --logs="$OUT/logs/$shape-cluster" \
      -- bash "$ROOT/scripts/pd_sweep.sh" "${ARGS[@]}" --out="$OUT" --points_of="$shape" >/dev/null; then
    echo "pd_sweep: $shape: some points failed" >&2
    sweep_failed=1
  fi
done

"$PYTHON" "$ROOT/scripts/sweep_report.py" "$OUT" --title="$TITLE" \
  --shapes="$SHAPES" --total_threads="$TOTAL_THREADS"
echo "pd_sweep: report in $OUT/summary.md" >&2
exit $sweep_failed
