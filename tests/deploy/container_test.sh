#!/usr/bin/env bash
# Builds the runtime stage of deploy/docker/Dockerfile with podman, from a
# Debian 12 root filesystem made here with debootstrap (no registry is
# reached) and the programs already built in BIN_DIR (nothing is compiled
# again), then runs a 1P1D cluster from the image, one container per process,
# and checks that it answers a chat prompt with the tokens the in-process
# engine gives; that the image carries no weights and runs as uid 10001;
# that the entrypoint refuses incomplete settings with a message; and that
# every container stops on SIGTERM with exit status 0.
#
#   tests/deploy/container_test.sh BIN_DIR MODEL
# Exit status 77 (a skip) when podman, runc or debootstrap is not installed
# (scripts/setup.sh --deploy installs them).
#
# This machine's sandbox refuses raising RLIMIT_NPROC / RLIMIT_NOFILE and
# runs hybrid cgroups, so containers run with runc and explicit --ulimit
# values; a program built with CUDA gets the host's CUDA libraries mounted,
# as a GPU host's container toolkit would.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="$(cd "$1" && pwd)"
MODEL="$(readlink -f "$2")"
CACHE="${BATON_CACHE_DIR:-/var/cache/baton}"
BASE=localhost/baton-test-base:bookworm
IMAGE="localhost/baton-test:$$"

for tool in podman runc debootstrap; do
  if ! command -v "$tool" >/dev/null; then
    echo "container_test: SKIP: $tool is not installed (scripts/setup.sh --deploy)"
    exit 77
  fi
done
[ -f "$MODEL" ] || { echo "container_test: no model at $MODEL" >&2; exit 1; }

WORK="$(mktemp -d /tmp/baton-container-test.XXXXXX)"
CONTAINERS=()
cleanup() {
  for c in "${CONTAINERS[@]}"; do podman rm -f -t 2 "$c" >/dev/null 2>&1 || true; done
  podman rmi -f "$IMAGE" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() {
  echo "container_test: FAIL: $*" >&2
  for c in "${CONTAINERS[@]}"; do
    echo "--- podman logs $c" >&2
    podman logs "$c" 2>&1 | tail -20 >&2 || true
  done
  exit 1
}

# --- the base image: Debian 12 minbase with the official image's sources -----
if ! podman image exists "$BASE"; then
  mkdir -p "$CACHE"
  tarball="$CACHE/debian-bookworm-minbase.tar"
  if [ ! -f "$tarball" ]; then
    echo "container_test: debootstrap bookworm (cached in $tarball)"
    root="$WORK/rootfs"
    debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian \
      >"$WORK/debootstrap.log" 2>&1 || { tail -20 "$WORK/debootstrap.log" >&2; fail "debootstrap"; }
    rm -f "$root/etc/apt/sources.list"
    cat >"$root/etc/apt/sources.list.d/debian.sources" <<'SOURCES'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -cf "$tarball.partial" . && mv "$tarball.partial" "$tarball"
    rm -rf "$root"
  fi
  podman import "$tarball" "$BASE" >/dev/null
fi

# --- the runtime stage, with the programs of BIN_DIR as the build stage ------
mkdir -p "$WORK/context/out/bin"
for program in baton-coordinator baton-worker baton baton-bench; do
  [ -x "$BIN/$program" ] || fail "$BIN/$program is not built"
  cp "$BIN/$program" "$WORK/context/out/bin/"
done
"$ROOT/deploy/docker/runtime_packages.sh" "$WORK/context/out/bin/"* \
  >"$WORK/context/out/runtime-packages.txt" 2>"$WORK/unpackaged.txt" ||
  { cat "$WORK/unpackaged.txt" >&2; fail "runtime_packages.sh"; }
echo "container_test: runtime packages: $(tr '\n' ' ' <"$WORK/context/out/runtime-packages.txt")"
podman build --isolation=chroot --pull=never -f "$ROOT/deploy/docker/Dockerfile" \
  --target runtime --build-arg DEBIAN_IMAGE="$BASE" \
  --build-context build="$WORK/context" -t "$IMAGE" "$ROOT" >"$WORK/build.log" 2>&1 ||
  { tail -30 "$WORK/build.log" >&2; fail "podman build"; }

RUN=(podman --runtime runc run --network=host
     --ulimit "nofile=$(ulimit -Sn):$(ulimit -Hn)" --ulimit nproc=4096:4096)
if grep -q /usr/local/cuda "$WORK/unpackaged.txt"; then
  RUN+=(-v /usr/local/cuda/lib:/usr/local/cuda/lib:ro -e LD_LIBRARY_PATH=/usr/local/cuda/lib)
fi
MOUNT=(-v "$MODEL:/models/model.gguf:ro")

# --- the image: no weights, uid 10001, settings checked ------------------------
[ "$(podman image inspect --format '{{.Config.User}}' "$IMAGE")" = "10001:10001" ] ||
  fail "the image does not run as 10001:10001"
# shellcheck disable=SC2016  # expanded in the container
"${RUN[@]}" --rm --entrypoint /bin/sh "$IMAGE" -c \
  'test "$(id -u)" = 10001 && ! find / -xdev \( -name "*.gguf" -o -name "*.safetensors" \) 2>/dev/null | grep -q .' ||
  fail "the image runs as root or carries model files"
set +e
out="$("${RUN[@]}" --rm "$IMAGE" coordinator 2>&1)"; rc=$?
set -e
if ! { [ "$rc" = 2 ] && grep -q "no model at /models/model.gguf" <<<"$out"; }; then
  fail "a coordinator without a model: exit $rc, '$out'"
fi
set +e
out="$("${RUN[@]}" --rm "${MOUNT[@]}" "$IMAGE" decode 2>&1)"; rc=$?
set -e
if ! { [ "$rc" = 2 ] && grep -q "BATON_COORDINATOR" <<<"$out"; }; then
  fail "a worker without a coordinator: exit $rc, '$out'"
fi

# --- a 1P1D cluster, one container per process ----------------------------------
start() {  # name, role, environment...
  local name="$1-$$" role="$2"
  shift 2
  local env=()
  for e in "$@"; do env+=(-e "$e"); done
  "${RUN[@]}" -d --name "$name" "${MOUNT[@]}" -e BATON_HOST=127.0.0.1 "${env[@]}" \
    "$IMAGE" "$role" >/dev/null
  CONTAINERS+=("$name")
}
wait_log() {  # container, pattern: prints the first matching line
  for _ in $(seq 600); do
    line="$(podman logs "$1" 2>&1 | grep -m1 -e "$2" || true)"
    [ -n "$line" ] && { echo "$line"; return 0; }
    [ "$(podman inspect --format '{{.State.Running}}' "$1")" = true ] || fail "$1 exited"
    sleep 0.1
  done
  fail "$1 printed no '$2' in 60 s"
}
start coordinator coordinator BATON_BIND=127.0.0.1 BATON_PORT=0 BATON_CONTROL_PORT=0
line="$(wait_log "coordinator-$$" "listening on")"
PUBLIC="$(sed -n 's/.*listening on \([^, ]*\),.*/\1/p' <<<"$line")"
CONTROL="$(sed -n 's/.*, control \([^, ]*\),.*/\1/p' <<<"$line")"
for role in prefill decode; do
  start "$role" "$role" BATON_COORDINATOR="$CONTROL" BATON_WORKER_PORT=0 \
    BATON_KV_PORT=0 BATON_WORKER_ID="$role-$$"
done
for role in prefill decode; do wait_log "$role-$$" "registered as" >/dev/null; done
echo "container_test: cluster up: public $PUBLIC, control $CONTROL"

# shellcheck source=tests/deploy/lib.sh
source "$ROOT/tests/deploy/lib.sh"
PROMPT="$DEPLOY_PROMPT"
expected="$(reference_answer "$BIN" "$MODEL")"
answer="$("${RUN[@]}" --rm "$IMAGE" baton generate --server="$PUBLIC" --prompt="$PROMPT" \
  --max_tokens="$DEPLOY_MAX_TOKENS" --temperature=0 2>&1)" || fail "baton generate: $answer"
echo "$answer"
[ "$(head -n 1 <<<"$answer")" = "$expected" ] ||
  fail "the cluster answered '$(head -n 1 <<<"$answer")', the in-process engine '$expected'"
grep -q "prefill worker prefill-$$ .*decode worker decode-$$" <<<"$answer" ||
  fail "the request did not run split over the two worker containers"

# --- SIGTERM: every process exits 0 ------------------------------------------------
for c in "decode-$$" "prefill-$$" "coordinator-$$"; do
  podman stop -t 20 "$c" >/dev/null
  code="$(podman inspect --format '{{.State.ExitCode}}' "$c")"
  [ "$code" = 0 ] || fail "$c exited $code on SIGTERM"
done
echo "container_test: ok"
