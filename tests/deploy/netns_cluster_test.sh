#!/usr/bin/env bash
# Three hosts on one machine: a coordinator, a prefill and a decode worker,
# each in its own network namespace (tests/netns/netns.sh: a private bridge,
# 10.201.0.0/24, nothing in the caller's namespace), each started through the
# container image's entrypoint as a deployment would. A prompt sent from the
# coordinator's host is answered with the in-process engine's tokens, its KV
# cache crossing from the prefill host to the decode host over the test
# network; every process stops on SIGTERM with exit status 0.
#
#   tests/deploy/netns_cluster_test.sh BIN_DIR MODEL
# Needs root and iproute2; exit status 77 (a skip) without them.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="$(cd "$1" && pwd)"
MODEL="$(readlink -f "$2")"
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
  echo "netns_cluster_test: SKIP: needs root and iproute2"
  exit 77
fi
# shellcheck source=tests/netns/netns.sh
source "$ROOT/tests/netns/netns.sh"
LOGS="$(mktemp -d /tmp/baton-netns-test.XXXXXX)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  netns_down
  rm -rf "$LOGS"
}
trap cleanup EXIT
fail() {
  echo "netns_cluster_test: FAIL: $*" >&2
  for f in "$LOGS"/*.log; do echo "--- $f" >&2; tail -15 "$f" >&2; done
  exit 1
}

netns_up "baton-t$$" 3
COORDINATOR="$(netns_addr 1)"
export BATON_BIN="$BIN" BATON_MODEL="$MODEL"
start() {  # host, name, environment..., -- role
  local host="$1" name="$2"
  shift 2
  local env=()
  while [ "$1" != "--" ]; do env+=("$1"); shift; done
  ip netns exec "$(netns_name "$host")" env "${env[@]}" \
    "$ROOT/deploy/docker/entrypoint.sh" "$2" >"$LOGS/$name.log" 2>&1 &
  PIDS+=("$!")
}
wait_log() {  # name, pattern
  for _ in $(seq 600); do
    grep -q -e "$2" "$LOGS/$1.log" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "$1 printed no '$2' in 60 s"
}
start 1 coordinator BATON_BIND="$COORDINATOR" -- coordinator
wait_log coordinator "listening on"
start 2 prefill BATON_HOST="$(netns_addr 2)" BATON_COORDINATOR="$COORDINATOR:50052" \
  BATON_WORKER_ID=prefill-host2 -- prefill
start 3 decode BATON_HOST="$(netns_addr 3)" BATON_COORDINATOR="$COORDINATOR:50052" \
  BATON_WORKER_ID=decode-host3 -- decode
wait_log prefill "registered as"
wait_log decode "registered as"

# shellcheck source=tests/deploy/lib.sh
source "$ROOT/tests/deploy/lib.sh"
PROMPT="$DEPLOY_PROMPT"
expected="$(reference_answer "$BIN" "$MODEL")"
answer="$(netns_exec 1 "$BIN/baton" generate --server="$COORDINATOR:50051" --prompt="$PROMPT" \
  --max_tokens="$DEPLOY_MAX_TOKENS" --temperature=0 2>&1)" || fail "baton generate: $answer"
echo "$answer"
[ "$(head -n 1 <<<"$answer")" = "$expected" ] ||
  fail "the answer '$(head -n 1 <<<"$answer")' is not the in-process engine's '$expected'"
grep -q "host_tcp" <<<"$answer" || fail "the KV cache did not cross over TCP"
grep -q "prefill worker prefill-host2 ($(netns_addr 2):50060), decode worker decode-host3 ($(netns_addr 3):50060)" \
  <<<"$answer" || fail "the request did not run prefill on host 2 and decode on host 3"

for i in 2 1 0; do
  kill -TERM "${PIDS[$i]}"
  set +e
  wait "${PIDS[$i]}"
  rc=$?
  set -e
  [ "$rc" = 0 ] || fail "process $i exited $rc on SIGTERM"
done
PIDS=()
echo "netns_cluster_test: ok"
