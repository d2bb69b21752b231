#!/usr/bin/env bash
# Admission under overload (docs/reliability.md, "Load shedding"): on a local
# cluster whose coordinator runs with --ttft_slo_ms, measures the cluster's
# capacity with a closed loop, then offers FACTOR times that rate (Poisson
# arrivals) for DURATION seconds and reports what was admitted and what was
# shed, the admitted requests' TTFT against the SLO, how long each refusal
# took, and the resident memory of the coordinator and of every worker,
# sampled each second.
#
#   scripts/overload_bench.sh [options]
#     --shape=SHAPE        cluster shape (default 1C; see local_cluster.sh)
#     --slo_ms=N           the coordinator's --ttft_slo_ms (default 2000)
#     --factor=X           offered load / measured capacity (default 2)
#     --duration_s=N       length of the overload run (default 60)
#     --input_len=N        prompt tokens (default 256)
#     --output_len=N       tokens per answer (default 32)
#     --concurrency=N      requests in flight in the capacity run (default 4)
#     --threads=N          compute threads per worker (default 1)
#     --out=DIR            results (default a new temp dir)
#     --bin=DIR            the binaries (default build/bin; built if absent)
# Prints the host (CPU model, ISA path) first. A benchmark, not a test: it
# asserts nothing, and its figures hold for the host it ran on.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHAPE=1C SLO_MS=2000 FACTOR=2 DURATION=60 INPUT_LEN=256 OUTPUT_LEN=32
CONCURRENCY=4 THREADS=1 OUT="" BIN="$ROOT/build/bin"
for arg in "$@"; do
  case "$arg" in
    --shape=*) SHAPE="${arg#*=}" ;;
    --slo_ms=*) SLO_MS="${arg#*=}" ;;
    --factor=*) FACTOR="${arg#*=}" ;;
    --duration_s=*) DURATION="${arg#*=}" ;;
    --input_len=*) INPUT_LEN="${arg#*=}" ;;
    --output_len=*) OUTPUT_LEN="${arg#*=}" ;;
    --concurrency=*) CONCURRENCY="${arg#*=}" ;;
    --threads=*) THREADS="${arg#*=}" ;;
    --out=*) OUT="${arg#*=}" ;;
    --bin=*) BIN="${arg#*=}" ;;
    *) echo "overload_bench: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done
[[ -n "$OUT" ]] || OUT="$(mktemp -d /tmp/baton-overload-bench.XXXXXX)"
mkdir -p "$OUT"
if [[ ! -x "$BIN/baton-bench" || ! -x "$BIN/baton-worker" ]]; then
  bash "$ROOT/scripts/build.sh" baton-coordinator baton-worker baton baton-bench >&2
fi
echo "host: $(bash "$ROOT/scripts/host_info.sh" | tail -1)"
echo "cluster $SHAPE, $THREADS thread(s) per worker, --ttft_slo_ms=$SLO_MS;" \
  "prompts $INPUT_LEN tokens, answers $OUTPUT_LEN tokens"
export OUT FACTOR DURATION INPUT_LEN OUTPUT_LEN CONCURRENCY BIN SLO_MS
# baton-bench with the workload's flags, its JSON to $OUT/NAME.json (run by
# the commands local_cluster.sh starts, which see BATON_SERVER).
bench() {
  local name="$1"; shift
  "$BIN/baton-bench" --server="$BATON_SERVER" --dataset-name=random \
    --random-input-len="$INPUT_LEN" --random-output-len="$OUTPUT_LEN" \
    --save-result --result-dir="$OUT" --result-filename="$name.json" "$@" \
    >"$OUT/$name.log" 2>&1
}
export -f bench
# 1. Capacity: a closed loop on a cluster that sheds nothing.
bash "$ROOT/scripts/local_cluster.sh" "$SHAPE" --no-build --bin="$BIN" \
  --threads="$THREADS" -- bash -c 'set -euo pipefail
bench capacity --num-prompts=$((CONCURRENCY * 8)) --max-concurrency="$CONCURRENCY"'
rate="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["request_throughput"])' "$OUT/capacity.json")"
OFFERED="$(python3 -c "print(float('$rate') * float('$FACTOR'))")"
export OFFERED
echo "capacity $rate req/s; offering $OFFERED req/s for $DURATION s"
# 2. Overload, on a fresh cluster with the SLO.
bash "$ROOT/scripts/local_cluster.sh" "$SHAPE" --no-build --bin="$BIN" \
  --threads="$THREADS" --coordinator_flag=--ttft_slo_ms="$SLO_MS" -- \
  bash -c 'set -euo pipefail
# Resident memory of every process of the cluster, once a second.
( while :; do
    for pid in $BATON_PIDS; do
      printf "%s %s %s\n" "$(date +%s.%N)" "$pid" \
        "$(ps -o rss= -p "$pid" 2>/dev/null | tr -d " ")"
    done
    sleep 1
  done ) >"$OUT/rss.txt" &
sampler=$!
bench overload --request-rate="$OFFERED" --max-duration-s="$DURATION" \
  --num-prompts="$(python3 -c "print(int(float(\"$OFFERED\") * $DURATION * 1.5) + 10)")" \
  --request-timeout-s=120 --metric-percentiles=50,90,99 || true
kill "$sampler"
echo "$BATON_PIDS" >"$OUT/pids.txt"'
python3 - "$OUT" "$SLO_MS" <<'PY'
import collections, json, sys
out, slo = sys.argv[1], float(sys.argv[2])
cap = json.load(open(f"{out}/capacity.json"))
r = json.load(open(f"{out}/overload.json"))
sent = r["num_requests"] - r["not_sent"]
def pct(d, p):
    return d.get(f"p{p}", float("nan"))
t, f = r["ttft_ms"], r["refusal_ms"]
print(f"capacity: {cap['request_throughput']:.2f} req/s "
      f"(closed loop, {cap['completed']} requests, TTFT p50 {cap['ttft_ms']['median']:.0f} ms)")
print(f"overload: {r['duration_s']:.1f} s: "
      f"{sent} sent, {r['completed']} completed ({r['request_throughput']:.2f} req/s), "
      f"{r['refused']} refused at admission ({100.0 * r['refused'] / max(1, sent):.1f}%), "
      f"{r['failed'] - r['refused']} failed otherwise, {r['aborted']} cut by the time limit")
print(f"admitted TTFT ms: p50 {t['median']:.0f}, p99 {pct(t, 99):.0f}, max {t['max']:.0f} "
      f"(SLO {slo:.0f}); within the SLO: "
      f"{sum(1 for q in r.get('requests', []) if q.get('success') and q['ttft_ms'] <= slo)} of {r['completed']}")
if f["count"]:
    print(f"time to a refusal ms: p50 {f['median']:.2f}, p99 {pct(f, 99):.2f}, max {f['max']:.2f}")
pids = open(f"{out}/pids.txt").read().split()
rss = collections.defaultdict(list)
for line in open(f"{out}/rss.txt"):
    parts = line.split()
    if len(parts) == 3 and parts[2].isdigit():
        rss[parts[1]].append(int(parts[2]) / 1024)
for i, pid in enumerate(pids):
    v = rss.get(pid, [])
    if not v:
        continue
    name = "coordinator" if i == 0 else f"worker {i - 1}"
    q = max(1, len(v) // 4)
    print(f"RSS {name:11}: first {v[0]:.0f} MiB, last {v[-1]:.0f} MiB, max {max(v):.0f} MiB; "
          f"mean of the first quarter {sum(v[:q]) / q:.0f}, of the last {sum(v[-q:]) / q:.0f} "
          f"({len(v)} samples)")
PY
echo "results in $OUT"
