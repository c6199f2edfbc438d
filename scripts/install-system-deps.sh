#!/usr/bin/env bash
# System packages the tests use: bubblewrap (sandbox), Prometheus, promtool and the Pushgateway (metrics),
# and the s3rver S3-protocol server from npm (storage). Idempotent; skips what is present.
# --sandbox-only: just what the local sandbox needs (what `make run` uses).
# --cluster: what `make images` and `make test-cluster` add (docs/cluster.md): podman and runc, docker.io
#   (the node's dockerd), debootstrap (the images' base), etcd, and the tools that build Kubernetes from
#   Debian's source (golang-go, gcc, jq, rsync, the fixed reflect2). Opt-in: CI's `make test` does not.
set -euo pipefail
cd "$(dirname "$0")/.."
sandbox_only=false
[ "${1:-}" = "--sandbox-only" ] && sandbox_only=true
if [ "${1:-}" = "--cluster" ]; then
  need=()
  for pkg in podman runc docker.io debootstrap etcd-server golang-go gcc libc6-dev make jq rsync dpkg-dev \
    golang-github-modern-go-reflect2-dev iptables openssl curl prometheus-pushgateway; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need+=("$pkg")
  done
  if [ ${#need[@]} -gt 0 ]; then
    [ "$(id -u)" -eq 0 ] || { echo "missing system packages: ${need[*]} (run as root)" >&2; exit 1; }
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  exit 0
fi

need_apt=()
command -v bwrap >/dev/null 2>&1 || need_apt+=(bubblewrap)
command -v setpriv >/dev/null 2>&1 || need_apt+=(util-linux)
if ! $sandbox_only; then
  command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
  command -v prometheus-pushgateway >/dev/null 2>&1 || need_apt+=(prometheus-pushgateway)
fi
# the local sandbox runs tests with Debian's python3 and its pytest (readable by the sandbox uid)
/usr/bin/python3 -c "import pytest" >/dev/null 2>&1 || need_apt+=(python3 python3-pytest)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing system packages: ${need_apt[*]} (run as root or install them with apt-get)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if ! $sandbox_only && [ ! -x node_modules/.bin/s3rver ]; then
  npm install --no-audit --no-fund --silent >/dev/null
fi
