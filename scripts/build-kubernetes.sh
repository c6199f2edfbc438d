#!/usr/bin/env bash
# Builds a Kubernetes control plane and kubelet from Debian bookworm's `kubernetes` source package
# (1.20.2) and caches the binaries, so later runs (and CI machines that keep the cache) reuse them.
#   K8S_CACHE   where binaries and the source live (default /var/cache/gagar/k8s)
# Prints the binary folder. About 11 minutes on 2 cores, 1.4 GB RAM, a 2.4 GB Go cache (removed after).
# Needs: golang-go, jq, rsync, gcc, golang-github-modern-go-reflect2-dev
# (bash scripts/install-system-deps.sh --cluster).
set -euo pipefail
cache=${K8S_CACHE:-/var/cache/gagar/k8s}
bin="$cache/bin"
wanted=(kube-apiserver kube-controller-manager kube-scheduler kubelet)
have_all() { for b in "${wanted[@]}"; do [ -x "$bin/$b" ] || return 1; done; }
if have_all; then
  echo "$bin"
  exit 0
fi
mkdir -p "$cache/src"
cd "$cache/src"
if [ ! -d kubernetes-source ]; then
  # a private deb-src list: the source package without touching the machine's apt sources
  apt_dir="$cache/apt"
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/sources.list.d"
  printf 'deb-src http://deb.debian.org/debian bookworm main\n' > "$apt_dir/sources.list"
  apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o "Dir::Etc::SourceParts=$apt_dir/sources.list.d"
    -o "Dir::State::Lists=$apt_dir/lists")
  apt-get "${apt_opts[@]}" update -qq >&2
  apt-get "${apt_opts[@]}" source --download-only kubernetes >&2
  dsc=$(ls kubernetes_*.dsc | head -n1)
  dpkg-source --no-check -x "$dsc" kubernetes-source >&2
  # vendored reflect2 1.0.1 crashes kube-apiserver under Go >= 1.18 (SIGSEGV in mapiterinit)
  rm -rf kubernetes-source/vendor/github.com/modern-go/reflect2
  cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 kubernetes-source/vendor/github.com/modern-go/reflect2
fi
cd kubernetes-source
export GOCACHE="$cache/go-cache" GOPATH="$cache/gopath"
targets=()
for b in "${wanted[@]}"; do targets+=("cmd/$b"); done
start=$(date +%s)
nice -n 10 make WHAT="${targets[*]}" >&2
mkdir -p "$bin"
for b in "${wanted[@]}"; do cp "_output/bin/$b" "$bin/$b"; done
echo "built ${wanted[*]} in $(($(date +%s) - start)) s" >&2
rm -rf "$GOCACHE" _output
echo "$bin"
