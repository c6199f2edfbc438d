#!/usr/bin/env bash
# Stops the cluster scripts/cluster-up.sh started: each process by the id recorded under STATE/pids,
# the node's parts first (kubelet, dockerd, which stops the pods' containers), etcd last; then
# unmounts what kubelet left mounted under STATE. Safe to run twice.
#   GAGAR_CLUSTER_DIR   state folder (default /var/lib/gagar/cluster)
set -euo pipefail
state=${GAGAR_CLUSTER_DIR:-/var/lib/gagar/cluster}
stop() {  # stop NAME: TERM, up to 30 s, then KILL; only if the id still runs the program it was
  local file="$state/pids/$1.pid"
  [ -s "$file" ] || return 0
  local pid
  pid=$(cat "$file")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 60); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "cluster-down.sh: $1 ($pid) ignored TERM; killing it" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$file"
  echo "stopped $1 ($pid)" >&2
}
for name in kubelet kube-scheduler kube-controller-manager dockerd kube-apiserver etcd; do
  stop "$name"
done
if [ -d "$state" ]; then
  findmnt -rn -o TARGET | grep "^$state/" | sort -r | while read -r target; do
    umount "$target" 2>/dev/null || umount -l "$target" || true
  done
fi
