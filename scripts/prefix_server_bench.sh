#!/usr/bin/env bash
# The multi-turn workload over HTTP, one client (bench/openai_multiturn.py)
# for both servers, one after the other on this host: Baton's OpenAI gateway
# on a 1C cluster with the prefix cache on and off, then llama.cpp's server
# (llama-cpp-python[server], `scripts/setup.sh --references`) with its RAM
# prompt cache on and off, on the same model with the same threads
# (docs/performance.md, "Prefix cache").
#
#   scripts/prefix_server_bench.sh [options]
#     --conversations=N    (default 8)
#     --turns=N            (default 8)
#     --system_len=N       shared system prompt words (default 512)
#     --user_len=N         words per user message (default 64)
#     --output_len=N       tokens per answer (default 64)
#     --threads=N          compute threads on each side (default 2)
#     --kv_cache_mib=N     Baton's KV pool (default 1024)
#     --cache_size_mib=N   llama.cpp's RAM cache (default 2048)
#     --runs=LIST          in order (default baton-on,baton-off,llama-ram,llama-off)
#     --llama_extra_bufts=auto|on|off  llama.cpp's extra CPU buffer types, its
#                          AMX kernels among them (default auto: off on an AMX
#                          host, where they crash; bench/llama_cpp_host.py)
#     --out=DIR            result JSON files (default a new temp dir)
#     --bin=DIR            Baton's binaries (default build/bin; built if absent)
# Prints the host (CPU model, ISA path) and one line per run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CONVERSATIONS=8 TURNS=8 SYSTEM_LEN=512 USER_LEN=64 OUTPUT_LEN=64 THREADS=2
KV_MIB=1024 CACHE_MIB=2048 RUNS=baton-on,baton-off,llama-ram,llama-off OUT=""
EXTRA_BUFTS=auto
BIN="$ROOT/build/bin"
for arg in "$@"; do
  case "$arg" in
    --conversations=*) CONVERSATIONS="${arg#*=}" ;;
    --turns=*) TURNS="${arg#*=}" ;;
    --system_len=*) SYSTEM_LEN="${arg#*=}" ;;
    --user_len=*) USER_LEN="${arg#*=}" ;;
    --output_len=*) OUTPUT_LEN="${arg#*=}" ;;
    --threads=*) THREADS="${arg#*=}" ;;
    --kv_cache_mib=*) KV_MIB="${arg#*=}" ;;
    --cache_size_mib=*) CACHE_MIB="${arg#*=}" ;;
    --runs=*) RUNS="${arg#*=}" ;;
    --llama_extra_bufts=auto | --llama_extra_bufts=on | --llama_extra_bufts=off)
      EXTRA_BUFTS="${arg#*=}" ;;
    --out=*) OUT="${arg#*=}" ;;
    --bin=*) BIN="${arg#*=}" ;;
    *) echo "prefix_server_bench: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done
PY="$ROOT/.venv/bin/python"
MODEL="$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf"
IFS=, read -r -a runs <<<"$RUNS"
for run in "${runs[@]}"; do
  case "$run" in
    baton-on | baton-off | llama-ram | llama-off) ;;
    *) echo "prefix_server_bench: --runs takes baton-on, baton-off, llama-ram" \
      "and llama-off, got '$run'" >&2; exit 2 ;;
  esac
done
if [[ " ${runs[*]} " == *" llama-"* ]] &&
  ! "$PY" -c 'import llama_cpp.server.app, uvicorn' 2>/dev/null; then
  echo "prefix_server_bench: llama.cpp's server is not installed in .venv;" \
    "run scripts/setup.sh --references" >&2
  exit 2
fi
[[ -f "$MODEL" ]] || bash "$ROOT/scripts/setup.sh"
[[ -n "$OUT" ]] || OUT="$(mktemp -d /tmp/baton-prefix-server-bench.XXXXXX)"
mkdir -p "$OUT"
if [[ " ${runs[*]} " == *" baton-"* && ! -x "$BIN/baton-worker" ]]; then
  bash "$ROOT/scripts/build.sh" baton-coordinator baton-worker baton >&2
fi
echo "host: $(bash "$ROOT/scripts/host_info.sh" | tail -1)"
echo "workload: $CONVERSATIONS conversations x $TURNS turns, system $SYSTEM_LEN," \
  "user $USER_LEN words, output $OUTPUT_LEN tokens, one request at a time;" \
  "$THREADS threads; Baton KV pool $KV_MIB MiB, llama.cpp RAM cache $CACHE_MIB MiB," \
  "llama.cpp extra buffer types $EXTRA_BUFTS"
CLIENT=("$PY" "$ROOT/bench/openai_multiturn.py" --model="$MODEL"
  --conversations="$CONVERSATIONS" --turns="$TURNS" --system_len="$SYSTEM_LEN"
  --user_len="$USER_LEN" --output_len="$OUTPUT_LEN")

# A free loopback port for llama.cpp's server.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

run_llama() {
  local cache="$1" file="$2" port pid
  port="$(free_port)"
  local flags=(--model "$MODEL" --host 127.0.0.1 --port "$port" --n_threads "$THREADS"
    --n_threads_batch "$THREADS" --n_ctx 4096 --n_batch 512)
  [[ "$cache" == ram ]] &&
    flags+=(--cache true --cache_type ram --cache_size "$((CACHE_MIB << 20))")
  "$PY" "$ROOT/bench/llama_cpp_server.py" --extra_bufts="$EXTRA_BUFTS" "${flags[@]}" \
    >"$OUT/llama-$cache.server.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null ||
      { echo "prefix_server_bench: llama.cpp's server exited; see $OUT/llama-$cache.server.log" >&2
        return 1; }
    sleep 0.1
  done
  local rc=0
  "${CLIENT[@]}" --url="http://127.0.0.1:$port" --server=llama_cpp >"$file" || rc=$?
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  return "$rc"
}

for run in "${runs[@]}"; do
  file="$OUT/$run.json"
  case "$run" in
    baton-*)
      bash "$ROOT/scripts/local_cluster.sh" 1C --no-build --bin="$BIN" --http_port=0 \
        --kv_cache_mib="$KV_MIB" --threads="$THREADS" \
        --worker_flag=--prefix_cache="${run#baton-}" -- \
        bash -c 'exec "$@" --url="http://$BATON_HTTP"' client \
        "${CLIENT[@]}" --server=baton >"$file" 2>"$OUT/$run.log" ||
        { echo "prefix_server_bench: $run failed; see $OUT/$run.log" >&2; exit 1; } ;;
    llama-*)
      run_llama "${run#llama-}" "$file" 2>"$OUT/$run.log" ||
        { echo "prefix_server_bench: $run failed; see $OUT/$run.log" >&2; exit 1; } ;;
  esac
  python3 - "$file" "$run" <<'PY'
import json, sys
# The client's JSON is the last line (local_cluster.sh prints the address first).
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
f, l = r["first_turns"], r["later_turns"]
cached = ""
if "cached_tokens_mean" in l:
    cached = (f", cached {l['cached_tokens_mean']:.0f} of "
              f"{l['prompt_tokens_mean']:.0f} prompt tokens")
print(f"{sys.argv[2]:9}: {r['duration_s']:7.1f} s, {r['output_tokens_per_s']:6.1f} out tok/s; "
      f"turn 1 TTFT p50 {f['ttft_ms_p50']:7.0f} ms; turns >= 2 TTFT p50 "
      f"{l['ttft_ms_p50']:7.0f} ms p90 {l['ttft_ms_p90']:7.0f} ms{cached}")
PY
done
echo "results in $OUT"
