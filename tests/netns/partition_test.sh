#!/usr/bin/env bash
# Network partitions between hosts (tests/netns/netns.sh: a coordinator, a
# prefill and a decode worker, each in its own network namespace on a
# private bridge). In each case a request's KV transfer is paused at a known
# point (the prefill worker stops itself after sending 4 layers:
# --fault=kv_layer_sent:stop@4), one host's link is pulled, and the prefill
# worker continues into the dead link:
#   1. the decode host's link;
#   2. the prefill host's link.
# Each case must end within its bound with the greedy answer of the
# in-process engine or a clear retriable status (UNAVAILABLE or
# DEADLINE_EXCEEDED), never a hang; after the link is back, every worker is
# healthy again with every KV block free (as the coordinator's status shows
# it), and the same request is answered with the in-process engine's tokens.
#
#   tests/netns/partition_test.sh BIN_DIR MODEL
# Needs root and iproute2; exit status 77 (a skip) without them.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="$(cd "$1" && pwd)"
MODEL="$(readlink -f "$2")"
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
  echo "partition_test: SKIP: needs root and iproute2"
  exit 77
fi
# shellcheck source=tests/netns/netns.sh
source "$ROOT/tests/netns/netns.sh"
LOGS="$(mktemp -d /tmp/baton-partition-test.XXXXXX)"
declare -A PID
cleanup() {
  for pid in "${PID[@]}"; do kill -CONT "$pid" 2>/dev/null || true; kill -KILL "$pid" 2>/dev/null || true; done
  netns_down
  rm -rf "$LOGS"
}
trap cleanup EXIT
fail() {
  echo "partition_test: FAIL: $*" >&2
  for f in "$LOGS"/*.log; do echo "--- $f" >&2; tail -20 "$f" >&2; done
  exit 1
}
wait_log() {  # name, pattern, [seconds]
  for _ in $(seq $((${3:-60} * 10))); do
    grep -q -e "$2" "$LOGS/$1.log" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "$1 printed no '$2' in ${3:-60} s"
}

netns_up "baton-p$$" 3
C="$(netns_addr 1)"
PROMPT="Name one colour of the sky."
MAX_TOKENS=12
expected="$("$BIN/baton" generate --model="$MODEL" --prompt="$PROMPT" \
  --max_tokens="$MAX_TOKENS" --temperature=0 2>/dev/null | head -n 1)"

ip netns exec "$(netns_name 1)" "$BIN/baton-coordinator" --listen="$C:50051" \
  --control_listen="$C:50052" --model="$MODEL" --heartbeat_ms=200 --lease_ttl_ms=2000 \
  --transfer_timeout_ms=10000 --queue_timeout_ms=5000 --drain_timeout_s=0 \
  >"$LOGS/coordinator.log" 2>&1 &
PID[coordinator]=$!
wait_log coordinator "listening on"
start_worker() {  # host, role, extra flags...
  local host="$1" role="$2"
  shift 2
  local a
  a="$(netns_addr "$host")"
  ip netns exec "$(netns_name "$host")" "$BIN/baton-worker" --role="$role" \
    --listen="$a:50060" --kv_listen="$a:50061" --model="$MODEL" --coordinator="$C:50052" \
    --worker_id="$role-h$host" --kv_stall_timeout_ms=2000 --drain_timeout_s=0 "$@" \
    >>"$LOGS/$role.log" 2>&1 &
  PID[$role]=$!
}
status_json() { netns_exec 1 "$BIN/baton" status --server="$C:50051" --json 2>/dev/null || true; }
# Until both workers are healthy with every KV block free, as the
# coordinator sees them (bounded: the links are up, so this is quick).
wait_recovered() {
  for _ in $(seq 600); do
    if status_json | python3 -c '
import json, sys
w = json.load(sys.stdin)["workers"]
ok = len(w) == 2 and all(x["healthy"] and x["kv_blocks_free"] == x["kv_blocks_total"] for x in w)
sys.exit(0 if ok else 1)' 2>/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  fail "the workers did not come back healthy with every block free in 60 s: $(status_json)"
}
ask() {  # name: a request from the coordinator's host, bounded by a deadline
  netns_exec 1 "$BIN/baton" generate --server="$C:50051" --prompt="$PROMPT" \
    --max_tokens="$MAX_TOKENS" --temperature=0 --deadline_ms=60000 >"$LOGS/$1.out" 2>&1
}

start_worker 2 prefill --fault=kv_layer_sent:stop@4
start_worker 3 decode
wait_recovered

run_case() {  # name, host whose link is pulled
  local name="$1" host="$2"
  ask "$name" &
  local client=$!
  wait_log prefill "fault point kv_layer_sent: stopped"
  netns_link "$host" down
  local start=$SECONDS
  kill -CONT "${PID[prefill]}"
  set +e
  wait "$client"
  local rc=$?
  set -e
  local took=$((SECONDS - start))
  local first
  first="$(head -n 1 "$LOGS/$name.out")"
  if [ "$rc" = 0 ]; then
    [ "$first" = "$expected" ] || fail "$name: answered '$first', not '$expected'"
    echo "partition_test: $name: completed with the reference answer after ${took} s"
  else
    grep -q -E "UNAVAILABLE|DEADLINE_EXCEEDED|unavailable|deadline" "$LOGS/$name.out" ||
      fail "$name: failed without a retriable status: $(cat "$LOGS/$name.out")"
    echo "partition_test: $name: ended in ${took} s with: $(tail -n 1 "$LOGS/$name.out")"
  fi
  netns_link "$host" up
  wait_recovered
  ask "$name-after" || fail "$name: the request after the link came back failed: $(cat "$LOGS/$name-after.out")"
  [ "$(head -n 1 "$LOGS/$name-after.out")" = "$expected" ] ||
    fail "$name: after the link came back the answer was '$(head -n 1 "$LOGS/$name-after.out")'"
}

run_case decode-link 3
# The fault fires once per process: a fresh prefill worker for the next case.
kill -TERM "${PID[prefill]}"
wait "${PID[prefill]}" || true
: >"$LOGS/prefill.log"
start_worker 2 prefill --fault=kv_layer_sent:stop@4
wait_recovered
run_case prefill-link 2

for name in prefill decode coordinator; do
  kill -TERM "${PID[$name]}"
  set +e
  wait "${PID[$name]}"
  rc=$?
  set -e
  [ "$rc" = 0 ] || fail "$name exited $rc on SIGTERM"
  unset "PID[$name]"
done
echo "partition_test: ok"
