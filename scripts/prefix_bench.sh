#!/usr/bin/env bash
# The prefix cache's benchmark: baton-bench's multi-turn workload on local
# clusters with the cache on and off, side by side, one run after the other
# on this host (docs/performance.md, "Prefix cache").
#
#   scripts/prefix_bench.sh [options]
#     --shapes=LIST        cluster shapes (default 2C,1P1D)
#     --conversations=N    (default 32)
#     --turns=N            (default 8)
#     --system_len=N       shared system prompt tokens (default 512)
#     --user_len=N         tokens per user message (default 64)
#     --output_len=N       tokens per answer (default 64)
#     --concurrency=N      conversations in flight (default 8)
#     --kv_cache_mib=N     KV pool per worker (default 1024)
#     --threads=N          compute threads per worker (default 1)
#     --caches=LIST        cache settings to run, in order (default on,off)
#     --out=DIR            result JSON files (default a new temp dir)
#     --bin=DIR            the binaries (default build/bin; built if absent)
#     --coordinator_flag=F pass F to the coordinator (repeatable), e.g.
#                          --coordinator_flag=--local_prefill_tokens=0
# Prints the host (CPU model, ISA path) and one line per run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHAPES=2C,1P1D CONVERSATIONS=32 TURNS=8 SYSTEM_LEN=512 USER_LEN=64
OUTPUT_LEN=64 CONCURRENCY=8 KV_MIB=1024 THREADS=1 OUT="" BIN="$ROOT/build/bin"
CACHES=on,off
COORDINATOR_FLAGS=()
for arg in "$@"; do
  case "$arg" in
    --shapes=*) SHAPES="${arg#*=}" ;;
    --conversations=*) CONVERSATIONS="${arg#*=}" ;;
    --turns=*) TURNS="${arg#*=}" ;;
    --system_len=*) SYSTEM_LEN="${arg#*=}" ;;
    --user_len=*) USER_LEN="${arg#*=}" ;;
    --output_len=*) OUTPUT_LEN="${arg#*=}" ;;
    --concurrency=*) CONCURRENCY="${arg#*=}" ;;
    --kv_cache_mib=*) KV_MIB="${arg#*=}" ;;
    --threads=*) THREADS="${arg#*=}" ;;
    --caches=*) CACHES="${arg#*=}" ;;
    --out=*) OUT="${arg#*=}" ;;
    --bin=*) BIN="${arg#*=}" ;;
    --coordinator_flag=*) COORDINATOR_FLAGS+=("--coordinator_flag=${arg#*=}") ;;
    *) echo "prefix_bench: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done
[[ -n "$OUT" ]] || OUT="$(mktemp -d /tmp/baton-prefix-bench.XXXXXX)"
mkdir -p "$OUT"
if [[ ! -x "$BIN/baton-bench" || ! -x "$BIN/baton-worker" ]]; then
  bash "$ROOT/scripts/build.sh" baton-coordinator baton-worker baton baton-bench >&2
fi
echo "host: $(bash "$ROOT/scripts/host_info.sh" | tail -1)"
echo "workload: $CONVERSATIONS conversations x $TURNS turns, system $SYSTEM_LEN," \
  "user $USER_LEN, output $OUTPUT_LEN tokens, $CONCURRENCY in flight;" \
  "KV pool $KV_MIB MiB and $THREADS threads per worker"
IFS=, read -r -a shapes <<<"$SHAPES"
IFS=, read -r -a caches <<<"$CACHES"
for cache in "${caches[@]}"; do
  [[ "$cache" == on || "$cache" == off ]] ||
    { echo "prefix_bench: --caches takes on and off, got '$cache'" >&2; exit 2; }
done
for shape in "${shapes[@]}"; do
  for cache in "${caches[@]}"; do
    file="$OUT/$shape-cache-$cache.json"
    bash "$ROOT/scripts/local_cluster.sh" "$shape" --no-build --bin="$BIN" \
      --kv_cache_mib="$KV_MIB" --threads="$THREADS" --worker_flag=--prefix_cache="$cache" \
      ${COORDINATOR_FLAGS[@]+"${COORDINATOR_FLAGS[@]}"} -- \
      bash -c 'exec "$0" --server="$BATON_SERVER" "$@"' \
      "$BIN/baton-bench" --dataset-name=multiturn \
      --multiturn-conversations="$CONVERSATIONS" --multiturn-turns="$TURNS" \
      --multiturn-system-len="$SYSTEM_LEN" --multiturn-user-len="$USER_LEN" \
      --random-output-len="$OUTPUT_LEN" --max-concurrency="$CONCURRENCY" \
      --save-result --result-dir="$OUT" \
      --result-filename="$(basename "$file")" >"$OUT/$shape-cache-$cache.log" 2>&1 ||
      { echo "prefix_bench: $shape cache $cache failed; see $OUT/$shape-cache-$cache.log" >&2; exit 1; }
    python3 - "$file" "$shape" "$cache" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["summary"]
f, l = r["first_turns"], r["later_turns"]
print(f"{sys.argv[2]:5} cache {sys.argv[3]:3}: {r['duration_s']:7.1f} s, "
      f"{r['output_tokens_per_s']:6.1f} out tok/s, turns failed {r['turns_failed']}; "
      f"turn 1 TTFT p50 {f['ttft_ms_p50']:8.0f} ms; turns >= 2 TTFT p50 "
      f"{l['ttft_ms_p50']:8.0f} ms p90 {l['ttft_ms_p90']:8.0f} ms, "
      f"cached {l['cached_tokens_mean']:6.0f} of {l['prompt_tokens_mean']:6.0f} "
      f"prompt tokens, KV moved {l['kv_transfer_bytes_mean'] / 2**20:6.2f} MiB/turn")
PY
  done
done
echo "results in $OUT"
