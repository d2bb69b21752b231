#!/usr/bin/env bash
# Chaos soak: a 2P2D cluster on loopback under a steady load while a random
# worker is, every few seconds, SIGKILLed (and started again), SIGTERMed
# (drained, then started again) or frozen (SIGSTOP, SIGCONT a few seconds
# later). At the end it prints what happened to every request — completed,
# migrated (the coordinator's baton_migrations_total), refused at admission,
# failed cleanly (a retriable status or the request's own deadline), lost
# (anything else: must be 0) — and the KV blocks still held once the
# workers are idle (must be 0). Exit status 1 if anything was lost or
# leaked.
#
#   scripts/chaos.sh [--minutes=N | --seconds=N] [--rate=R] [--seed=N]
#                    [--bin=DIR] [--out=DIR]
#     --seconds / --minutes  length of the load (default 60 s)
#     --rate                 requests per second offered (default 0.5)
#     --seed                 seeds the faults and the workload (default 1)
#     --bin                  the binaries (default build/bin)
#     --out                  where the logs and the load's JSON go (default a
#                            temporary folder, removed if the run passes)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_TOTAL=60 RATE=0.5 SEED=1 BIN="$ROOT/build/bin" OUT=""
MODEL="$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf"
for arg in "$@"; do
  case "$arg" in
    --minutes=*) SECONDS_TOTAL=$(( ${arg#*=} * 60 )) ;;
    --seconds=*) SECONDS_TOTAL="${arg#*=}" ;;
    --rate=*) RATE="${arg#*=}" ;;
    --seed=*) SEED="${arg#*=}" ;;
    --bin=*) BIN="${arg#*=}" ;;
    --out=*) OUT="${arg#*=}" ;;
    --model=*) MODEL="${arg#*=}" ;;
    *) echo "chaos: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done
KEEP=1
if [[ -z "$OUT" ]]; then OUT="$(mktemp -d /tmp/baton-chaos.XXXXXX)"; KEEP=0; fi
mkdir -p "$OUT"
RANDOM=$SEED
declare -A PID
cleanup() {
  local status=$?
  for pid in "${PID[@]}"; do
    kill -CONT "$pid" 2>/dev/null || true
    kill -KILL "$pid" 2>/dev/null || true
  done
  # A temporary folder of a run that passed goes; a failed run's logs stay.
  if [[ "$status" == 0 && "$KEEP" == 0 ]]; then rm -rf "$OUT"; fi
}
trap cleanup EXIT
log() { echo "chaos: $*"; }

address_of() {  # log file, marker: the HOST:PORT after the marker
  for _ in $(seq 600); do
    local a
    a="$(sed -n "s/.*$2 \([0-9.]*:[0-9]*\).*/\1/p" "$1" 2>/dev/null | head -1)"
    [[ -n "$a" ]] && { echo "$a"; return 0; }
    sleep 0.1
  done
  echo "chaos: no '$2' in $1" >&2
  return 1
}
"$BIN/baton-coordinator" --listen=127.0.0.1:0 --control_listen=127.0.0.1:0 \
  --model="$MODEL" --heartbeat_ms=200 --lease_ttl_ms=2000 --drain_timeout_s=0 \
  --metrics_listen=127.0.0.1:0 >"$OUT/coordinator.log" 2>&1 &
PID[coordinator]=$!
SERVER="$(address_of "$OUT/coordinator.log" "listening on")"
CONTROL="$(sed -n 's/.*, control \([^, ]*\).*/\1/p' "$OUT/coordinator.log" | head -1)"
METRICS="$(address_of "$OUT/coordinator.log" "metrics on")"
ROLES=(prefill prefill decode decode)
start_worker() {  # index
  local i="$1"
  "$BIN/baton-worker" --role="${ROLES[$i]}" --listen=127.0.0.1:0 --kv_listen=127.0.0.1:0 \
    --model="$MODEL" --coordinator="$CONTROL" --worker_id="chaos-$i" \
    --kv_stall_timeout_ms=3000 --drain_timeout_s=5 >>"$OUT/worker$i.log" 2>&1 &
  PID[w$i]=$!
}
for i in 0 1 2 3; do start_worker "$i"; done
healthy() {
  "$BIN/baton" status --server="$SERVER" --json 2>/dev/null |
    python3 -c 'import json,sys; print(sum(w["healthy"] for w in json.load(sys.stdin)["workers"]))' 2>/dev/null ||
    echo 0
}
for _ in $(seq 600); do [[ "$(healthy)" == 4 ]] && break; sleep 0.1; done
[[ "$(healthy)" == 4 ]] || { log "the workers did not come up; see $OUT"; exit 1; }
log "2P2D up (coordinator $SERVER); load at $RATE req/s for $SECONDS_TOTAL s; logs in $OUT"

"$BIN/baton-bench" --server="$SERVER" --dataset-name=random --random-input-len=128 \
  --random-output-len=48 --random-range-ratio=0.5 --request-rate="$RATE" \
  --num-prompts=100000 --max-duration-s="$SECONDS_TOTAL" --request-timeout-s=120 \
  --seed="$SEED" --save-result --result-dir="$OUT" --result-filename=load.json \
  >"$OUT/load.log" 2>&1 &
LOAD=$!

declare -A FAULTS
end=$((SECONDS + SECONDS_TOTAL))
while (( SECONDS + 8 < end )); do
  sleep $(( 3 + RANDOM % 4 ))
  i=$(( RANDOM % 4 ))
  case $(( RANDOM % 3 )) in
    0) log "SIGKILL worker $i (${ROLES[$i]})"; FAULTS[kill]=$(( ${FAULTS[kill]:-0} + 1 ))
       kill -KILL "${PID[w$i]}"; wait "${PID[w$i]}" 2>/dev/null || true
       sleep 2; start_worker "$i" ;;
    1) log "SIGTERM worker $i (${ROLES[$i]})"; FAULTS[term]=$(( ${FAULTS[term]:-0} + 1 ))
       kill -TERM "${PID[w$i]}"; wait "${PID[w$i]}" 2>/dev/null || true
       start_worker "$i" ;;
    2) log "freeze worker $i (${ROLES[$i]}) for 3 s"; FAULTS[freeze]=$(( ${FAULTS[freeze]:-0} + 1 ))
       kill -STOP "${PID[w$i]}"; sleep 3; kill -CONT "${PID[w$i]}" ;;
  esac
done
set +e
wait "$LOAD"
set -e
# Idle: every worker back and holding nothing.
leaked=-1
for _ in $(seq 600); do
  leaked="$("$BIN/baton" status --server="$SERVER" --json 2>/dev/null | python3 -c '
import json, sys
w = json.load(sys.stdin)["workers"]
print(-1 if len(w) != 4 or not all(x["healthy"] for x in w)
      else sum(x["kv_blocks_total"] - x["kv_blocks_free"] for x in w))' 2>/dev/null || echo -1)"
  [[ "$leaked" == 0 ]] && break
  sleep 0.1
done
migrated="$(curl -s "http://$METRICS/metrics" | sed -n 's/^baton_migrations_total{[^}]*} //p' | head -1)"
python3 - "$OUT/load.json" "${migrated:-0}" "$leaked" "${FAULTS[kill]:-0}" \
  "${FAULTS[term]:-0}" "${FAULTS[freeze]:-0}" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
migrated, leaked = float(sys.argv[2]), int(sys.argv[3])
kills, terms, freezes = sys.argv[4:7]
clean = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "ABORTED"}
refused = failed_clean = lost = 0
lost_examples = []
for q in r["requests"]:
    if not q["sent"] or q["success"] or q["aborted"]:
        continue
    code = q.get("error_code", "")
    if code == "RESOURCE_EXHAUSTED":
        refused += 1
    elif code in clean:
        failed_clean += 1
    else:
        lost += 1
        lost_examples.append(f"{code}: {q.get('error_message', '')}"[:200])
print(f"chaos: faults: {kills} SIGKILL, {terms} SIGTERM, {freezes} freezes")
print(f"chaos: requests sent {r['num_requests'] - r['not_sent']}: completed {r['completed']}, "
      f"migrated {migrated:.0f}, refused at admission {refused}, failed cleanly {failed_clean}, "
      f"cut by the time limit {r['aborted']}, lost {lost}")
print(f"chaos: KV blocks still held once the workers are idle (leaked): {'unknown (workers not back)' if leaked < 0 else leaked}")
for e in lost_examples[:5]:
    print(f"chaos: lost: {e}")
sys.exit(0 if lost == 0 and leaked == 0 else 1)
PY
