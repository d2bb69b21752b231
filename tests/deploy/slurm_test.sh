#!/usr/bin/env bash
# deploy/slurm/baton.sbatch under a real Slurm: starts munged, slurmctld and
# slurmd on this machine (their own configuration, state, sockets and ports
# in a temporary directory, proctrack/linuxproc and task/none, so no
# cgroups), submits the batch script with sbatch, and checks that the cluster
# it starts as srun steps answers a prompt with the in-process engine's
# tokens, that the job ends with the command's status and leaves no Baton
# process behind, and that a job without a model fails with a message.
#
#   tests/deploy/slurm_test.sh BIN_DIR MODEL
# Must run as root (the daemons). Exit status 77 (a skip) when Slurm or
# munge is not installed (scripts/setup.sh --deploy) or not root.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="$(cd "$1" && pwd)"
MODEL="$(readlink -f "$2")"
for tool in slurmctld slurmd sbatch srun munged mungekey; do
  if ! command -v "$tool" >/dev/null; then
    echo "slurm_test: SKIP: $tool is not installed (scripts/setup.sh --deploy)"
    exit 77
  fi
done
if [ "$(id -u)" != 0 ]; then
  echo "slurm_test: SKIP: the Slurm daemons need root"
  exit 77
fi

DIR="$(mktemp -d /tmp/baton-slurm-test.XXXXXX)"
chmod 755 "$DIR"
cleanup() {
  # The daemons' command lines do not name DIR (SLURM_CONF does): wait on
  # their pid files' processes, so nothing writes under DIR while it goes.
  local pids=()
  for f in slurmd slurmctld munged; do
    if [ -f "$DIR/$f.pid" ]; then pids+=("$(cat "$DIR/$f.pid")"); fi
  done
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
  done
  pkill -KILL -f "$DIR" 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT
fail() {
  echo "slurm_test: FAIL: $*" >&2
  for f in "$DIR"/*.log "$DIR"/job-*.out "$DIR"/logs/*.log; do
    [ -f "$f" ] && { echo "--- $f" >&2; tail -15 "$f" >&2; }
  done
  exit 1
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# --- munge and Slurm, private to this test -------------------------------------
mkdir -p "$DIR/state" "$DIR/spool" "$DIR/logs"
mungekey -c -k "$DIR/munge.key" >/dev/null 2>&1 || dd if=/dev/urandom of="$DIR/munge.key" bs=1024 count=1 2>/dev/null
chmod 600 "$DIR/munge.key"
munged --force --socket="$DIR/munge.sock" --key-file="$DIR/munge.key" \
  --pid-file="$DIR/munged.pid" --log-file="$DIR/munged.log" --seed-file="$DIR/munged.seed" ||
  fail "munged did not start"
NODE="$(hostname -s)"
cat >"$DIR/slurm.conf" <<CONF
ClusterName=batontest
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
AuthInfo=socket=$DIR/munge.sock
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
PlugStackConfig=/dev/null
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=2048 State=UNKNOWN
PartitionName=batontest Nodes=$NODE Default=YES MaxTime=30 State=UP OverSubscribe=YES
CONF
export SLURM_CONF="$DIR/slurm.conf"
slurmctld -i || fail "slurmctld did not start"
slurmd || fail "slurmd did not start"
for _ in $(seq 300); do
  sinfo -h -o %t 2>/dev/null | grep -q idle && break
  sleep 0.1
done
sinfo -h -o %t | grep -q idle || fail "the node did not come up idle: $(sinfo 2>&1)"

# --- a 1P1D cluster as a job, answering one prompt -------------------------------
# The model under this test's directory: every process of its jobs names it.
ln -s "$MODEL" "$DIR/model.gguf"
MODEL="$DIR/model.gguf"
# shellcheck source=tests/deploy/lib.sh
source "$ROOT/tests/deploy/lib.sh"
PROMPT="$DEPLOY_PROMPT"
expected="$(reference_answer "$BIN" "$MODEL")"
export BATON_ROOT="$ROOT" BATON_BIN="$BIN" BATON_MODEL="$MODEL" BATON_LOGS="$DIR/logs"
BATON_PORT="$(free_port)"
BATON_CONTROL_PORT="$(free_port)"
export BATON_PORT BATON_CONTROL_PORT BATON_BIND=127.0.0.1
export BATON_READY_TIMEOUT_S=120
set +e
# shellcheck disable=SC2016  # expanded by the job's shell
sbatch --wait --quiet --output="$DIR/job-1.out" --time=10 "$ROOT/deploy/slurm/baton.sbatch" \
  sh -c '"$BATON_BIN/baton" generate --server="$BATON_SERVER" --prompt="$1" --max_tokens="$2" --temperature=0' \
  _ "$PROMPT" "$DEPLOY_MAX_TOKENS"
rc=$?
set -e
[ "$rc" = 0 ] || fail "the job exited $rc"
cat "$DIR/job-1.out"
grep -qx -- "$expected" "$DIR/job-1.out" ||
  fail "the job's answer differs from the in-process engine's '$expected'"
grep -q "prefill worker prefill-0-job.*decode worker decode-1-job" "$DIR/job-1.out" ||
  fail "the request did not run split over the two srun steps"
for _ in $(seq 100); do
  pgrep -f "$MODEL" >/dev/null || break
  sleep 0.1
done
! pgrep -af "$MODEL" || fail "Baton processes outlived the job"

# --- a job with a command that fails ends with its status --------------------------
set +e
BATON_LOGS="$DIR/logs-2" sbatch --wait --quiet --output="$DIR/job-2.out" --time=10 "$ROOT/deploy/slurm/baton.sbatch" \
  sh -c 'exit 3'
rc=$?
set -e
[ "$rc" = 3 ] || fail "a job whose command exits 3 exited $rc"

# --- a job without a model fails at once with a message ------------------------------
set +e
BATON_MODEL="$DIR/no-such-model.gguf" sbatch --wait --quiet --output="$DIR/job-3.out" \
  --time=10 "$ROOT/deploy/slurm/baton.sbatch" true
rc=$?
set -e
if ! { [ "$rc" != 0 ] && grep -q "no model at $DIR/no-such-model.gguf" "$DIR/job-3.out"; }; then
  fail "a job without a model: exit $rc, '$(cat "$DIR/job-3.out")'"
fi
grep -h "stopping" "$DIR"/logs/*.log || fail "the servers did not stop on SIGTERM"
echo "slurm_test: ok"
