#!/usr/bin/env bash
# `make test-cluster`: a one-node Kubernetes 1.20 (scripts/cluster-up.sh), the images its pods need,
# then the cluster tests (tests/cluster, tests/sandbox/test_k8s_cluster.py), then the cluster down again
# whatever happened. Prints the wall time. Extra arguments go to pytest.
#   PYTHON    interpreter with gagar[dev] (default .venv/bin/python)
#   ENGINE    the engine that built the images (default podman)
#   GAGAR_CLUSTER_DIR, K8S_CACHE: see scripts/cluster-up.sh
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
python=${PYTHON:-.venv/bin/python}
engine=${ENGINE:-podman}
[ "$engine" = podman ] && export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/scripts/podman-containers.conf}
state=${GAGAR_CLUSTER_DIR:-/var/lib/gagar/cluster}
export GAGAR_CLUSTER_DIR=$state
py() { PYTHONPATH=$PWD/src "$python" -c "from gagar.pipeline import images as m; $1"; }
sandbox_image=$(py 'print(m.stage_image("sandbox"))')
train_image=$(py 'print(m.stage_image("train", variant="cpu"))')  # runs the chart's upload Job
pushgateway_image=localhost/gagar-test/pushgateway:debian

# the images: every stage image (make images; the pipeline's DockerRunner run uses them all), built
# from this checkout every time (the engine's layer cache keeps what did not change), so the cluster
# runs the code under test; and a Pushgateway from Debian's binary on the same base
bash scripts/build-images.sh
if ! "$engine" image inspect "$pushgateway_image" >/dev/null 2>&1; then
  command -v prometheus-pushgateway >/dev/null || { echo "test-cluster.sh: prometheus-pushgateway is missing (make system-deps)" >&2; exit 1; }
  context=$(mktemp -d)
  cp "$(command -v prometheus-pushgateway)" "$context/pushgateway"
  printf 'FROM %s\nCOPY pushgateway /bin/pushgateway\nUSER 65534:65534\nENTRYPOINT ["/bin/pushgateway"]\n' \
    "$(py 'print(m.CPU_BASE)')" > "$context/Dockerfile"
  "$engine" build --pull=never -q -t "$pushgateway_image" "$context" >/dev/null
  rm -rf "$context"
fi

# the Docker API kfp.local's DockerRunner uses: podman's, on a socket of this run (docker: DOCKER_HOST as set)
service_pid=""
stop_all() {
  [ -n "$service_pid" ] && kill -TERM "$service_pid" 2>/dev/null && wait "$service_pid" 2>/dev/null
  bash scripts/cluster-down.sh
}
trap stop_all EXIT
if [ "$engine" = podman ]; then
  mkdir -p "$state"
  podman system service --time=0 "unix://$state/podman.sock" > "$state/podman-service.log" 2>&1 &
  service_pid=$!
  export DOCKER_HOST="unix://$state/podman.sock"
fi
eval "$(bash scripts/cluster-up.sh)"
docker_sock="unix://$state/docker.sock"
for image in "$sandbox_image" "$train_image" "$pushgateway_image"; do
  "$engine" save "$image" | docker -H "$docker_sock" load >/dev/null
done
# the address the node's pods reach this machine at (their bridge's gateway): the chart tests serve
# the KFP API the upload Job calls there
host_address=$(docker -H "$docker_sock" network inspect bridge -f '{{(index .IPAM.Config 0).Gateway}}')

status=0
GAGAR_K8S_TEST_IMAGE=$sandbox_image GAGAR_K8S_TEST_NAMESPACE=default \
  GAGAR_TEST_NODE_DOCKER=$docker_sock GAGAR_TASK_IMAGES__ENGINE=$engine \
  GAGAR_TEST_PUSHGATEWAY_IMAGE=$pushgateway_image GAGAR_TEST_TRAIN_IMAGE=$train_image \
  GAGAR_TEST_HOST_ADDRESS=$host_address \
  "$python" -m pytest -q -p no:cacheprovider tests/cluster tests/sandbox/test_k8s_cluster.py "$@" || status=$?
echo "make test-cluster: pytest exit $status, $(($(date +%s) - started)) s in all" >&2
exit "$status"
