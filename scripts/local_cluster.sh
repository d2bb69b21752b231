#!/usr/bin/env bash
# Starts a Baton cluster on loopback with the default model and keeps it
# running until SIGINT / SIGTERM, then stops every process it started.
#
#   scripts/local_cluster.sh SHAPE [options] [-- COMMAND ...]
#
# SHAPE counts workers by role: P prefill, D decode, C colocated (both),
# e.g. 1P1D, 2P1D, 1P2D, 2C, 1P1D1C.
# Options:
#   --port=N           coordinator's public port, the Baton API (default 0:
#                      any free port)
#   --control_port=N   coordinator's control plane, where workers register
#                      (default 0: any free port)
#   --threads=N        compute threads per worker (default 1)
#   --kv_cache_mib=N   KV pool per worker (default 256)
#   --device=DEV       where workers compute: cpu (default), cuda:N (every
#                      worker on GPU N), or cuda:N,M,... (worker i on the
#                      i-th listed GPU, the list repeating)
#   --model=PATH       model file (default: the default model)
#   --logs=DIR         worker and coordinator logs (default: a new temp dir)
#   --no-build         use the existing binaries
#   --bin=DIR          the binaries (default build/bin)
#   --http_port=N      also serve the OpenAI-compatible HTTP API (0: any free
#                      port); its address goes to COMMAND as BATON_HTTP
#   --metrics_port=N   coordinator metrics listener (0: any free port)
#   --worker_flag=F    pass F to every worker (repeatable), e.g.
#                      --worker_flag=--prefix_cache=off
#   --coordinator_flag=F  pass F to the coordinator (repeatable)
#   --step_traces=DIR  worker i writes its engine steps to DIR/worker<i>.jsonl
#                      (baton-worker --step_trace; scripts/step_costs.py)
#   --coordinator_cpus=LIST, --worker_cpus=LIST  pin the coordinator, every
#                      worker, to these CPUs (taskset -c LIST)
# With `-- COMMAND ...`, runs COMMAND once the cluster is ready (with
# BATON_SERVER=HOST:PORT, BATON_PIDS (the coordinator's process id, then
# the workers'), and BATON_HTTP with --http_port, in its
# environment), then stops the cluster and
# exits with COMMAND's status.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() { sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 1 ]] || usage
SHAPE="$1"; shift
PORT=0 CONTROL_PORT=0 THREADS=1 KV_MIB=256 DEVICE=cpu BUILD=1 LOGS="" BIN="$ROOT/build/bin" HTTP_PORT="" METRICS_PORT=""
MODEL="$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf"
COMMAND=() EXTRA_WORKER_FLAGS=() EXTRA_COORDINATOR_FLAGS=()
COORDINATOR_PIN=() WORKER_PIN=() STEP_TRACES=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --port=*) PORT="${1#*=}" ;;
    --control_port=*) CONTROL_PORT="${1#*=}" ;;
    --threads=*) THREADS="${1#*=}" ;;
    --kv_cache_mib=*) KV_MIB="${1#*=}" ;;
    --device=*) DEVICE="${1#*=}" ;;
    --model=*) MODEL="${1#*=}" ;;
    --logs=*) LOGS="${1#*=}" ;;
    --no-build) BUILD=0 ;;
    --bin=*) BIN="${1#*=}" ;;
    --http_port=*) HTTP_PORT="${1#*=}" ;;
    --metrics_port=*) METRICS_PORT="${1#*=}" ;;
    --worker_flag=*) EXTRA_WORKER_FLAGS+=("${1#*=}") ;;
    --coordinator_flag=*) EXTRA_COORDINATOR_FLAGS+=("${1#*=}") ;;
    --step_traces=*) STEP_TRACES="${1#*=}" ;;
    --coordinator_cpus=*) COORDINATOR_PIN=(taskset -c "${1#*=}") ;;
    --worker_cpus=*) WORKER_PIN=(taskset -c "${1#*=}") ;;
    --) shift; COMMAND=("$@"); break ;;
    -h|--help) usage ;;
    *) echo "local_cluster: unknown option '$1'" >&2; usage ;;
  esac
  shift
done

ROLES=()
rest="$SHAPE"
while [[ -n "$rest" ]]; do
  if [[ "$rest" =~ ^([0-9]+)([PDC])(.*)$ ]]; then
    count="${BASH_REMATCH[1]}" letter="${BASH_REMATCH[2]}" rest="${BASH_REMATCH[3]}"
    case "$letter" in P) role=prefill ;; D) role=decode ;; C) role=both ;; esac
    for ((i = 0; i < count; i++)); do ROLES+=("$role"); done
  else
    echo "local_cluster: shape '$SHAPE' is not like 1P1D, 2P1D, 1P2D, 2C" >&2
    exit 2
  fi
done
[[ ${#ROLES[@]} -gt 0 ]] || { echo "local_cluster: shape '$SHAPE' has no workers" >&2; exit 2; }

if [[ $BUILD -eq 1 ]]; then
  bash "$ROOT/scripts/build.sh" baton-coordinator baton-worker baton >&2
fi
[[ -f "$MODEL" ]] || { echo "local_cluster: no model at $MODEL (run scripts/setup.sh)" >&2; exit 1; }
[[ -n "$LOGS" ]] || LOGS="$(mktemp -d /tmp/baton-cluster.XXXXXX)"
mkdir -p "$LOGS"

PIDS=()
stop() {
  trap - INT TERM EXIT
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
trap stop EXIT

# Waits for the first stdout line of a process ("... listening on H:P, ...")
# and prints H:P.
listening_address() {
  local file="$1" pid="$2"
  for _ in $(seq 600); do
    if grep -q "listening on" "$file" 2>/dev/null; then
      sed -n 's/.*listening on \([^, ]*\).*/\1/p' "$file" | head -1
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || { echo "local_cluster: process $pid exited; see $LOGS" >&2; return 1; }
    sleep 0.1
  done
  echo "local_cluster: process $pid did not start in 60 s; see $LOGS" >&2
  return 1
}

COORDINATOR_FLAGS=("${EXTRA_COORDINATOR_FLAGS[@]}")
[[ -n "$HTTP_PORT" ]] && COORDINATOR_FLAGS+=(--http_listen="127.0.0.1:$HTTP_PORT")
[[ -n "$METRICS_PORT" ]] && COORDINATOR_FLAGS+=(--metrics_listen="127.0.0.1:$METRICS_PORT")
"${COORDINATOR_PIN[@]}" "$BIN/baton-coordinator" --listen="127.0.0.1:$PORT" --control_listen="127.0.0.1:$CONTROL_PORT" \
  --model="$MODEL" "${COORDINATOR_FLAGS[@]}" \
  >"$LOGS/coordinator.out" 2>"$LOGS/coordinator.log" &
PIDS+=($!)
COORDINATOR="$(listening_address "$LOGS/coordinator.out" "${PIDS[0]}")"
# "baton-coordinator listening on H:P, control H:P, model ...": workers
# register on the control plane.
CONTROL="$(sed -n 's/.*, control \([^, ]*\).*/\1/p' "$LOGS/coordinator.out" | head -1)"
# "baton-coordinator http on H:P" / "... metrics on H:P" follow the first line.
printed_address() {  # what ("http" or "metrics")
  for _ in $(seq 100); do
    sed -n "s/^baton-coordinator $1 on //p" "$LOGS/coordinator.out" | head -1 | grep . && return 0
    sleep 0.1
  done
  echo "local_cluster: the coordinator printed no '$1 on' line; see $LOGS" >&2
  return 1
}
HTTP="" METRICS=""
[[ -n "$HTTP_PORT" ]] && HTTP="$(printed_address http)"
[[ -n "$METRICS_PORT" ]] && METRICS="$(printed_address metrics)"

# Worker i's --device: cpu, cuda:N, or the i-th entry of cuda:N,M,...
DEVICES=("$DEVICE")
if [[ "$DEVICE" =~ ^cuda:([0-9]+(,[0-9]+)+)$ ]]; then
  IFS=, read -r -a ordinals <<<"${BASH_REMATCH[1]}"
  DEVICES=()
  for n in "${ordinals[@]}"; do DEVICES+=("cuda:$n"); done
fi
if [[ -n "$STEP_TRACES" ]]; then mkdir -p "$STEP_TRACES"; fi
for i in "${!ROLES[@]}"; do
  trace=()
  [[ -n "$STEP_TRACES" ]] && trace=(--step_trace="$STEP_TRACES/worker$i.jsonl")
  "${WORKER_PIN[@]}" "$BIN/baton-worker" --role="${ROLES[$i]}" --listen=127.0.0.1:0 --kv_listen=127.0.0.1:0 \
    --model="$MODEL" --threads="$THREADS" --kv_cache_mib="$KV_MIB" \
    --device="${DEVICES[$((i % ${#DEVICES[@]}))]}" \
    --coordinator="$CONTROL" "${trace[@]}" "${EXTRA_WORKER_FLAGS[@]}" \
    >"$LOGS/worker$i.out" 2>"$LOGS/worker$i.log" &
  PIDS+=($!)
done
for i in "${!ROLES[@]}"; do
  address="$(listening_address "$LOGS/worker$i.out" "${PIDS[$((i + 1))]}")"
  echo "worker $i: ${ROLES[$i]} at $address" >&2
done

# Ready when every worker is registered and healthy.
for _ in $(seq 300); do
  healthy="$("$BIN/baton" status --server="$COORDINATOR" --json 2>/dev/null |
    grep -o '"healthy":true' | wc -l || true)"
  [[ "$healthy" -eq ${#ROLES[@]} ]] && break
  sleep 0.1
done
if [[ "$healthy" -ne ${#ROLES[@]} ]]; then
  echo "local_cluster: only $healthy of ${#ROLES[@]} workers healthy; see $LOGS" >&2
  exit 1
fi
echo "local_cluster: $SHAPE ready, coordinator at $COORDINATOR (logs in $LOGS)" >&2
[[ -n "$HTTP" ]] && echo "local_cluster: OpenAI-compatible API at http://$HTTP/v1" >&2
[[ -n "$METRICS" ]] && echo "local_cluster: coordinator metrics at http://$METRICS/metrics" >&2
echo "$COORDINATOR"

if [[ ${#COMMAND[@]} -gt 0 ]]; then
  set +e
  BATON_SERVER="$COORDINATOR" BATON_HTTP="$HTTP" BATON_PIDS="${PIDS[*]}" "${COMMAND[@]}"
  status=$?
  set -e
  exit $status
fi
# `wait` returns when a signal arrives, so the traps run at once.
ALIVE=("${PIDS[@]}")
while true; do
  wait -n "${ALIVE[@]}" 2>/dev/null || true
  still=()
  for pid in "${ALIVE[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then still+=("$pid"); else
      echo "local_cluster: process $pid exited (see $LOGS)" >&2
    fi
  done
  ALIVE=("${still[@]}")
  [[ ${#ALIVE[@]} -gt 0 ]] || exit 1
  sleep 0.2
done
