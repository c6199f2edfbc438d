#!/usr/bin/env bash
# A one-node Kubernetes 1.20 on this machine, from Debian bookworm's `kubernetes` source package
# (scripts/build-kubernetes.sh builds and caches the binaries). Everything listens on loopback:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet (node `localhost`) and a
# dockerd of its own. Every process's id is recorded under STATE/pids; scripts/cluster-down.sh ends
# each by its id.
#   usage: scripts/cluster-up.sh [--control-plane-only]
#     --control-plane-only   etcd and kube-apiserver only (no controllers, scheduler, kubelet, dockerd),
#                            e.g. for an API-server scale benchmark
#   GAGAR_CLUSTER_DIR   state folder (default /var/lib/gagar/cluster): certificates, kubeconfig, logs, pids
#   GAGAR_APISERVER_PORT (default 6443), GAGAR_ETCD_PORT (default 23790; peer port +1)
#   K8S_CACHE           binary cache (default /var/cache/gagar/k8s)
# Prints `export KUBECONFIG=STATE/kubeconfig` when the API server (and, in full mode, the node) is ready.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
control_plane_only=false
for arg in "$@"; do
  case "$arg" in
    --control-plane-only) control_plane_only=true ;;
    -h | --help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "cluster-up.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
state=${GAGAR_CLUSTER_DIR:-/var/lib/gagar/cluster}
api_port=${GAGAR_APISERVER_PORT:-6443}
etcd_port=${GAGAR_ETCD_PORT:-23790}
node=localhost
pause_image=gagar/pause:local

for tool in etcd openssl curl jq; do
  command -v "$tool" >/dev/null || { echo "cluster-up.sh: $tool is missing (bash scripts/install-system-deps.sh --cluster)" >&2; exit 1; }
done
if [ -d "$state/pids" ] && [ -n "$(ls -A "$state/pids" 2>/dev/null)" ]; then
  echo "cluster-up.sh: $state/pids is not empty: a cluster is up (scripts/cluster-down.sh first)" >&2
  exit 1
fi
bin=$(bash "$here/build-kubernetes.sh")
mkdir -p "$state"/{pki,pids,logs}
rm -rf "$state/etcd"  # a fresh cluster every time

# -- certificates: one CA; serving cert of the API server; client certs; service-account keys -------
pki="$state/pki"
if [ ! -s "$pki/ca.crt" ]; then
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=gagar-cluster-ca" \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
fi
issue() {  # issue NAME SUBJECT [SAN]
  local name=$1 subject=$2 san=${3:-}
  [ -s "$pki/$name.crt" ] && return 0
  openssl req -newkey rsa:2048 -nodes -subj "$subject" -keyout "$pki/$name.key" -out "$pki/$name.csr" 2>/dev/null
  local ext="$pki/$name.ext"
  printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' > "$ext"
  [ -n "$san" ] && printf 'subjectAltName=%s\n' "$san" >> "$ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 3650 -extfile "$ext" -out "$pki/$name.crt" 2>/dev/null
}
issue apiserver "/CN=kube-apiserver" \
  "IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
issue admin "/O=system:masters/CN=gagar-admin"
issue apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
issue kubelet "/O=system:nodes/CN=system:node:$node" "DNS:$node,IP:127.0.0.1"
issue controller-manager "/CN=system:kube-controller-manager"
issue scheduler "/CN=system:kube-scheduler"

kubeconfig() {  # kubeconfig FILE CERT_NAME
  cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: gagar
  cluster: {server: "https://127.0.0.1:$api_port", certificate-authority: "$pki/ca.crt"}
users:
- name: $2
  user: {client-certificate: "$pki/$2.crt", client-key: "$pki/$2.key"}
contexts:
- name: gagar
  context: {cluster: gagar, user: $2}
current-context: gagar
EOF
}
kubeconfig "$state/kubeconfig" admin
kubeconfig "$state/controller-manager.kubeconfig" controller-manager
kubeconfig "$state/scheduler.kubeconfig" scheduler
kubeconfig "$state/kubelet.kubeconfig" kubelet

start() {  # start NAME COMMAND...: in the background, its id recorded, output to logs/NAME.log
  local name=$1
  shift
  "$@" > "$state/logs/$name.log" 2>&1 &
  echo $! > "$state/pids/$name.pid"
}
wait_for() {  # wait_for WHAT SECONDS COMMAND...
  local what=$1 limit=$2
  shift 2
  for _ in $(seq "$limit"); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "cluster-up.sh: $what not ready after $limit s (logs in $state/logs)" >&2
  bash "$here/cluster-down.sh" >&2 || true
  exit 1
}
api() {  # api PATH: GET on the API server as the admin
  curl -sf --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" "https://127.0.0.1:$api_port$1"
}

started=$(date +%s)
start etcd etcd --name gagar --data-dir "$state/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
  --initial-advertise-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
  --initial-cluster "gagar=http://127.0.0.1:$((etcd_port + 1))" --listen-metrics-urls ""
wait_for etcd 30 curl -sf "http://127.0.0.1:$etcd_port/health"

# ServiceAccount admission needs the controller-manager's token controller: off with the control plane only.
admission=NamespaceLifecycle,LimitRanger,DefaultStorageClass,ResourceQuota,NodeRestriction
$control_plane_only || admission="$admission,ServiceAccount"
start kube-apiserver "$bin/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$etcd_port" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" --insecure-port 0 \
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
  --client-ca-file "$pki/ca.crt" \
  --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
  --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
  --kubelet-preferred-address-types Hostname,InternalIP \
  --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
  --service-account-issuer https://kubernetes.default.svc \
  --service-cluster-ip-range 10.96.0.0/16 \
  --authorization-mode Node,RBAC --enable-admission-plugins "$admission" \
  --allow-privileged=false --profiling=false
wait_for kube-apiserver 90 api /readyz

if ! $control_plane_only; then
  start kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig "$state/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$state/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$state/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 10257 --port 0 \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --use-service-account-credentials --leader-elect=false --controllers '*,-nodeipam'
  start kube-scheduler "$bin/kube-scheduler" \
    --kubeconfig "$state/scheduler.kubeconfig" \
    --authentication-kubeconfig "$state/scheduler.kubeconfig" \
    --authorization-kubeconfig "$state/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 10259 --port 0 --leader-elect=false

  # dockerd of the node, with a runc wrapper: this VM refuses the negative oom_score_adj kubelet asks for
  mkdir -p "$state/docker" "$state/docker-exec"
  wrapper="$state/runc-wrapper"
  cat > "$wrapper" <<'EOF'
#!/usr/bin/env bash
# runc, with a negative process.oomScoreAdj in the bundle raised to 0 (the VM refuses negative values)
bundle=""
prev=""
for arg in "$@"; do
  case "$prev" in --bundle | -b) bundle=$arg ;; esac
  case "$arg" in --bundle=*) bundle=${arg#--bundle=} ;; esac
  prev=$arg
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
  adj=$(jq '.process.oomScoreAdj // 0' "$bundle/config.json")
  if [ "$adj" -lt 0 ]; then
    jq '.process.oomScoreAdj = 0' "$bundle/config.json" > "$bundle/config.json.gagar" \
      && mv "$bundle/config.json.gagar" "$bundle/config.json"
  fi
fi
exec runc "$@"
EOF
  chmod +x "$wrapper"
  docker_sock="$state/docker.sock"
  start dockerd dockerd --data-root "$state/docker" --exec-root "$state/docker-exec" \
    -H "unix://$docker_sock" --pidfile "$state/docker.pid" \
    --add-runtime "gagar-runc=$wrapper" --default-runtime gagar-runc
  wait_for dockerd 60 docker -H "unix://$docker_sock" version

  # the pod sandbox (pause) image: the source tree's pause.c, built static and imported
  if ! docker -H "unix://$docker_sock" image inspect "$pause_image" >/dev/null 2>&1; then
    cache=${K8S_CACHE:-/var/cache/gagar/k8s}
    if [ ! -x "$cache/pause/pause" ]; then
      mkdir -p "$cache/pause"
      gcc -Os -static -o "$cache/pause/pause" "$cache/src/kubernetes-source/build/pause/linux/pause.c"
    fi
    tar -C "$cache/pause" -c pause | docker -H "unix://$docker_sock" import --change 'ENTRYPOINT ["/pause"]' - "$pause_image" >/dev/null
  fi

  start kubelet "$bin/kubelet" --kubeconfig "$state/kubelet.kubeconfig" \
    --hostname-override "$node" --address 127.0.0.1 --port 10250 --read-only-port 0 --healthz-port 10248 \
    --tls-cert-file "$pki/kubelet.crt" --tls-private-key-file "$pki/kubelet.key" \
    --client-ca-file "$pki/ca.crt" --anonymous-auth=false --authorization-mode AlwaysAllow \
    --root-dir "$state/kubelet" --cert-dir "$state/kubelet/pki" \
    --container-runtime docker --docker-endpoint "unix://$docker_sock" --pod-infra-container-image "$pause_image" \
    --image-gc-high-threshold 100 --image-pull-progress-deadline 10m \
    --eviction-hard 'memory.available<100Mi,nodefs.available<2Gi,imagefs.available<2Gi' \
    --cgroup-driver cgroupfs --cgroups-per-qos=false --enforce-node-allocatable= --fail-swap-on=false \
    --cluster-dns 10.96.0.10 --cluster-domain cluster.local --serialize-image-pulls=false
  ready() { api "/api/v1/nodes/$node" | jq -e '.status.conditions[] | select(.type=="Ready") | .status=="True"'; }
  wait_for "node $node" 120 ready
  sa() { api /api/v1/namespaces/default/serviceaccounts/default; }
  wait_for "default ServiceAccount" 60 sa
fi
echo "cluster up in $(($(date +%s) - started)) s ($($control_plane_only && echo 'control plane only' || echo "node $node"))" >&2
echo "export KUBECONFIG=$state/kubeconfig"
