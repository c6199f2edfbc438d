"""The Kubernetes sandbox backend at scale, against a real kube-apiserver and etcd that throttle it.

No kubelet: a node simulator (this file's ``simulate`` command, a test tool, not product code)
watches the backend's pods and does what scheduler and kubelet would: binds each pod, moves
it Pending -> Running -> Succeeded/Failed after log-normal latencies (a pod runs its group's
evaluations one after another: the sum of one draw per evaluation), injects image-pull
failures, evictions, never-scheduled pods and runners killed mid-group at given rates, and
writes each finished pod's results as its container's termination message, in the runner's
own encoding (``pod_runner.encode_result``: every evaluation's summary, the reference once),
with the nonce read from the pod's ConfigMap. It records what it decided per trajectory (a
pod's fault is the fate of every evaluation it holds), so the driver can check each result
against it.

The control plane: etcd (Debian's ``etcd-server``) and kube-apiserver 1.20 (the binary of
scripts/build-kubernetes.sh: ``$K8S_BIN``, else ``$K8S_CACHE/bin``, default
/var/cache/gagar/k8s/bin), on loopback ports of their own, token authentication,
AlwaysAllow, no ServiceAccount admission, API Priority and Fairness on with a small
``--max-requests-inflight``, and a FlowSchema sending the backend's user to a
PriorityLevelConfiguration with few seats and short queues, so it answers 429. The
simulator's user is in ``system:masters`` (exempt), as a node's traffic has its own level.
Every process is ended by its id at exit.

Each scenario runs the backend in a fresh process (``evaluate``), so its peak RSS is its own;
its jobs come as GRPO groups (``--group-size`` trajectories of one task in a row, 64 tasks),
fed to ``KubernetesBackend.evaluate`` lazily, which packs each group into one pod. The driver
prints, per scenario: results by status, each evaluation accounted for exactly once, results
matching the simulator's decisions, pods and ConfigMaps left, requests (and per evaluation),
the achieved request rate against the configured one, 429s seen by the client and
rejections counted by the server, peak RSS and wall time; and writes them as JSON.

    python benchmarks/k8s_scale.py --scales 1000,10000,41000 [--faults] [--out .work/k8s-scale.json]
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import math
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

NAMESPACE = "gagar-scale"
IMAGE = "sim/python:3"
BACKEND_USER, NODE_USER = "gagar-sandbox", "node-simulator"
TESTS = [f"tests/test_lib.py::test_{i}" for i in range(4)]
SOURCE = "def clamp(x, lo, hi):\n    return max(lo, x)\n"
FIXED = SOURCE.replace("max(lo, x)", "min(hi, max(lo, x))")
"""The benchmark task's library file before and after the patch: what a real summary carries."""
TASKS = 64
"""Distinct tasks the jobs cycle through, a group at a time."""
SELECTOR = "app.kubernetes.io/name=gagar-sandbox"
HERE = Path(__file__).resolve().parent


# -- the control plane -------------------------------------------------------------------------------


def find_apiserver() -> str:
    cache = os.environ.get("K8S_CACHE", "/var/cache/gagar/k8s")
    for candidate in (os.environ.get("K8S_BIN", ""), f"{cache}/bin"):
        path = Path(candidate, "kube-apiserver")
        if candidate and path.is_file():
            return str(path)
    sys.exit("kube-apiserver not found: run scripts/build-kubernetes.sh or set K8S_BIN")


class ControlPlane:
    """etcd + kube-apiserver on loopback in ``root``; ``stop()`` ends both by their ids."""

    def __init__(self, root: Path, api_port: int, etcd_port: int, inflight: int, mutating: int) -> None:
        self.root, self.api_port, self.etcd_port = root, api_port, etcd_port
        self.inflight, self.mutating = inflight, mutating
        self.procs: list[subprocess.Popen] = []
        self.tokens = {BACKEND_USER: os.urandom(16).hex(), NODE_USER: os.urandom(16).hex()}
        self.url = f"https://127.0.0.1:{api_port}"

    def _start(self, name: str, argv: list[str]) -> None:
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - the process keeps it
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))

    def start(self) -> None:
        if shutil.which("etcd") is None:
            sys.exit("etcd is missing: apt-get install etcd-server")
        shutil.rmtree(self.root, ignore_errors=True)
        (self.root / "certs").mkdir(parents=True)
        key = self.root / "sa.key"
        subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True)
        tokens = self.root / "tokens.csv"
        tokens.write_text(
            f'{self.tokens[BACKEND_USER]},{BACKEND_USER},u1,"gagar"\n'
            f'{self.tokens[NODE_USER]},{NODE_USER},u2,"system:masters"\n'
        )
        self._start("etcd", [
            "etcd", "--name", "scale", "--data-dir", str(self.root / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{self.etcd_port + 1}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.etcd_port + 1}",
            "--initial-cluster", f"scale=http://127.0.0.1:{self.etcd_port + 1}",
            "--quota-backend-bytes", str(4 << 30), "--listen-metrics-urls", "",
        ])  # fmt: skip
        self._start("kube-apiserver", [
            find_apiserver(), "--etcd-servers", f"http://127.0.0.1:{self.etcd_port}",
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(self.api_port), "--insecure-port", "0",
            "--cert-dir", str(self.root / "certs"),
            "--token-auth-file", str(tokens), "--authorization-mode", "AlwaysAllow",
            "--service-account-key-file", str(key), "--service-account-signing-key-file", str(key),
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-cluster-ip-range", "10.96.0.0/16",
            "--disable-admission-plugins", "ServiceAccount",
            "--enable-priority-and-fairness=true",
            "--max-requests-inflight", str(self.inflight),
            "--max-mutating-requests-inflight", str(self.mutating),
            "--profiling=false", "--allow-privileged=false",
        ])  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if self.get("/readyz") == "ok":
                    return
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(1)
        self.stop()
        sys.exit(f"the control plane did not come up; logs in {self.root}")

    def get(self, path: str, user: str = NODE_USER) -> str:
        import ssl

        req = urllib.request.Request(
            self.url + path, headers={"Authorization": f"Bearer {self.tokens[user]}"}
        )
        ctx = ssl._create_unverified_context()  # a self-signed serving cert on loopback
        with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
            return resp.read().decode()

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()

    def kubeconfig(self, user: str) -> Path:
        path = self.root / f"{user}.kubeconfig"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "scale",
            "clusters": [
                {"name": "scale", "cluster": {"server": self.url, "insecure-skip-tls-verify": True}}
            ],
            "users": [{"name": user, "user": {"token": self.tokens[user]}}],
            "contexts": [{"name": "scale", "context": {"cluster": "scale", "user": user}}],
        }))  # fmt: skip
        return path


def api_client(kubeconfig: Path, pool: int) -> Any:
    import urllib3
    from kubernetes import client
    from kubernetes import config as kube_config

    from gagar.sandbox.k8s.backend import configure_client

    urllib3.disable_warnings()
    configuration = client.Configuration()
    kube_config.load_kube_config(str(kubeconfig), client_configuration=configuration)
    configure_client(configuration, pool)
    return client.ApiClient(configuration)


def apply_flow_control(api: Any, seats: int, queues: int, hand: int, queue_length: int) -> None:
    """The backend's user on a priority level of its own with ``seats`` shares (flowcontrol v1beta1)."""
    group = "/apis/flowcontrol.apiserver.k8s.io/v1beta1"
    level = {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1beta1", "kind": "PriorityLevelConfiguration",
        "metadata": {"name": "gagar-sandbox"},
        "spec": {"type": "Limited", "limited": {"assuredConcurrencyShares": seats, "limitResponse": {
            "type": "Queue",
            "queuing": {"queues": queues, "handSize": hand, "queueLengthLimit": queue_length},
        }}},
    }  # fmt: skip
    schema = {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1beta1", "kind": "FlowSchema",
        "metadata": {"name": "gagar-sandbox"},
        "spec": {
            "priorityLevelConfiguration": {"name": "gagar-sandbox"}, "matchingPrecedence": 500,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{
                "subjects": [{"kind": "User", "user": {"name": BACKEND_USER}}],
                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                   "namespaces": ["*"], "clusterScope": True}],
                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
            }],
        },
    }  # fmt: skip
    for path, body in ((f"{group}/prioritylevelconfigurations", level), (f"{group}/flowschemas", schema)):
        api.call_api(path, "POST", body=body, auth_settings=["BearerToken"], _preload_content=False)
    from kubernetes import client

    client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))


def server_rejections(plane: ControlPlane) -> int:
    """429s the API server counted for the backend's priority level (APF rejections)."""
    total = 0
    for line in plane.get("/metrics").splitlines():
        if (
            line.startswith("apiserver_flowcontrol_rejected_requests_total{")
            and 'priority_level="gagar-sandbox"' in line
        ):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


# -- the node simulator ------------------------------------------------------------------------------


def lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(sigma * rng.gauss(0, 1))


def simulate(args: argparse.Namespace) -> None:
    """Watch the namespace's sandbox pods and play scheduler and kubelet for each (see the docstring)."""
    from kubernetes import client
    from kubernetes.watch.watch import iter_resp_lines

    from gagar.sandbox.k8s.pod_runner import encode_result

    api = api_client(Path(args.kubeconfig), args.workers)
    core = client.CoreV1Api(api)
    rng = random.Random(args.seed)
    timers: list[tuple[float, int, Any]] = []
    cond = threading.Condition()
    seen: set[str] = set()
    seq = 0
    pool = ThreadPoolExecutor(args.workers)
    decisions = open(args.decisions, "a", encoding="utf-8")  # noqa: SIM115
    lock = threading.Lock()

    def later(delay: float, action: Any) -> None:
        nonlocal seq
        with cond:
            seq += 1
            heapq.heappush(timers, (time.monotonic() + delay, seq, action))
            cond.notify()

    def status(name: str, body: dict) -> bool:
        try:
            core.patch_namespaced_pod_status(name, NAMESPACE, {"status": body})
            return True
        except client.ApiException as exc:
            if exc.status != 404:  # deleted by the backend meanwhile: nothing to do
                print(f"simulator: status of {name}: {exc.status} {exc.reason}", file=sys.stderr)
            return False

    def container(state: dict) -> list[dict]:
        return [
            {
                "name": "sandbox",
                "image": IMAGE,
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": state,
            }
        ]

    def bind(name: str) -> bool:
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": "sim-node"}}  # fmt: skip
        try:
            core.create_namespaced_pod_binding(name, NAMESPACE, body, _preload_content=False)
            return True
        except client.ApiException as exc:
            if exc.status != 404:
                print(f"simulator: bind {name}: {exc.status} {exc.reason}", file=sys.stderr)
            return False

    def finish(name: str, passed: list[bool]) -> None:
        try:
            spec = json.loads(core.read_namespaced_config_map(name, NAMESPACE).data["spec.json"])
        except client.ApiException:
            return
        results = []
        for ok in passed:
            outcome = "passed" if ok else "failed"
            code = 0 if ok else 1
            report = {"configured": True, "exitstatus": code, "tests": dict.fromkeys(TESTS, outcome),
                      "foreign": [], "hacks": [], "collected": len(TESTS)}  # fmt: skip
            judged = {"resets": [], "sources": [["lib.py", SOURCE, FIXED]], "own_packages": ["lib"]}
            log = f"{'.' if ok else 'F'}{'...'}\n4 tests, {outcome} (simulated)\n"
            results.append({
                "stage": "done", "exit_code": code, "report": report, "judged": judged, "log": log,
                "isolation": "process (simulated)", "duration_s": 1.0,
            })  # fmt: skip
        group = {"results": results}
        message = encode_result(group, spec["nonce"])
        terminated = {"exitCode": 0, "reason": "Completed", "message": message}
        status(name, {"phase": "Succeeded", "containerStatuses": container({"terminated": terminated})})

    def killed(name: str) -> None:
        """The runner killed mid-group (OOM of the node, a kill from outside): no message, exit 137."""
        terminated = {"exitCode": 137, "reason": "Error"}
        status(name, {"phase": "Failed", "containerStatuses": container({"terminated": terminated})})

    def running(name: str) -> bool:
        return status(name, {"phase": "Running", "containerStatuses": container({"running": {}})})

    def plan(pod: dict) -> None:
        """Decide the pod's fate and schedule its transitions: bind, then start, then end."""
        name = pod["metadata"]["name"]
        keys = json.loads(pod["metadata"]["annotations"]["gagar.dev/keys"])
        u, sched = rng.random(), lognormal(rng, args.schedule_s, 0.5)
        start = lognormal(rng, args.start_s, args.sigma)
        run = sum(lognormal(rng, args.run_s, args.sigma) for _ in keys)
        unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                         "message": "0/1 nodes are available: 1 Insufficient cpu. (simulated)"}  # fmt: skip
        pull_error = {"waiting": {"reason": "ErrImagePull", "message": f"{IMAGE}: not found (simulated)"}}
        evicted = {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}
        fates: list[str]
        if u < args.never_scheduled:
            fates = ["never_scheduled"] * len(keys)
            later(sched, lambda: status(name, {"phase": "Pending", "conditions": [unschedulable]}))
        else:
            u -= args.never_scheduled
            if u < args.pull_failure:
                fates = ["pull_failure"] * len(keys)

                def then() -> None:
                    status(name, {"phase": "Pending", "containerStatuses": container(pull_error)})
            elif u < args.pull_failure + args.evicted:
                fates = ["evicted"] * len(keys)

                def then() -> None:
                    if running(name):
                        later(run / 2, lambda: status(name, evicted))
            elif u < args.pull_failure + args.evicted + args.killed:
                fates = ["killed"] * len(keys)

                def then() -> None:
                    if running(name):
                        later(run * rng.random(), lambda: killed(name))
            else:
                fates = ["passed" if rng.random() < args.pass_rate else "failed" for _ in keys]

                def then() -> None:
                    if running(name):
                        later(run, lambda: finish(name, [fate == "passed" for fate in fates]))

            def first() -> None:
                if bind(name):
                    later(start, then)

            later(sched, first)
        with lock:
            for key, fate in zip(keys, fates, strict=True):
                decisions.write(json.dumps({"key": key, "fate": fate}) + "\n")
            decisions.flush()

    def clock_loop() -> None:
        while True:
            with cond:
                while not timers or timers[0][0] > time.monotonic():
                    cond.wait(None if not timers else max(0.0, timers[0][0] - time.monotonic()))
                _, _, action = heapq.heappop(timers)
            pool.submit(action)

    threading.Thread(target=clock_loop, daemon=True).start()
    with contextlib.suppress(client.ApiException):
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "sim-node"}})
    version = None
    print("simulator: ready", flush=True)
    while True:
        if version is None:
            body = json.loads(
                core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR, _preload_content=False).data
            )
            version, items = body["metadata"]["resourceVersion"], body["items"]
            events = [{"type": "ADDED", "object": item} for item in items]
        else:
            resp = core.list_namespaced_pod(
                NAMESPACE, label_selector=SELECTOR, watch=True, resource_version=version,
                allow_watch_bookmarks=True, timeout_seconds=60, _preload_content=False,
            )  # fmt: skip
            events = (json.loads(line) for line in iter_resp_lines(resp))
        for event in events:
            obj = event["object"]
            if event["type"] == "ERROR":
                version = None
                break
            version = obj["metadata"].get("resourceVersion", version)
            name = obj["metadata"].get("name")
            if event["type"] == "ADDED" and name not in seen:
                seen.add(name)
                plan(obj)


# -- one scenario in its own process -----------------------------------------------------------------


def make_jobs(n: int, group_size: int) -> list:
    """``n`` jobs as GRPO groups: ``group_size`` trajectories of one task in a row, cycling over the tasks."""
    from gagar.sandbox.base import Prediction
    from gagar.sandbox.patch import file_diff
    from gagar.schema.task import Task

    gold = file_diff("lib.py", SOURCE, FIXED)
    tests = "".join(
        f"def test_{i}():\n    from lib import clamp\n    assert clamp({i}, 0, 2) == {min(i, 2)}\n\n"
        for i in range(4)
    )
    tasks = [
        Task(
            instance_id=f"clamp-{t}",
            repo="bench/clamp",
            snapshot={"lib.py": SOURCE, "tests/test_lib.py": tests},
            problem_statement="clamp ignores hi",
            patch=gold,
            FAIL_TO_PASS=TESTS[3:],
            PASS_TO_PASS=TESTS[:3],
            environment=IMAGE,
        )
        for t in range(TASKS)
    ]
    jobs = []
    for k in range(n):
        task = tasks[(k // group_size) % TASKS]
        jobs.append(
            (task, Prediction(instance_id=task.instance_id, model_patch=gold, trajectory_id=f"traj-{k:05d}"))
        )
    return jobs


def evaluate(args: argparse.Namespace) -> None:
    """Run the backend on ``args.n`` evaluations; print one JSON line of what happened."""
    from kubernetes import client

    from gagar.sandbox.k8s import KubernetesBackend, KubernetesSandboxConfig, RetryPolicy

    jobs = make_jobs(args.n, args.group_size)
    config = KubernetesSandboxConfig(
        namespace=NAMESPACE, max_concurrency=args.in_flight, api_workers=args.api_workers,
        group_size=args.group_size,
        create_rate_per_s=args.qps, burst=args.burst, start_deadline_s=args.start_deadline_s,
        step_quorum=args.quorum, straggler_wait_s=args.straggler_wait_s,
        retry=RetryPolicy(max_throttled=100),
    )  # fmt: skip
    api = api_client(Path(args.kubeconfig), args.api_workers)
    backend = KubernetesBackend(config, client.CoreV1Api(api), client.NetworkingV1Api(api))
    start = time.monotonic()
    arrivals: list[float] = []
    results = backend.evaluate(jobs, on_result=lambda _: arrivals.append(time.monotonic() - start))
    wall = time.monotonic() - start
    stats = backend.last_run
    core = client.CoreV1Api(api)
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items
    cms = core.list_namespaced_config_map(NAMESPACE, label_selector=SELECTOR).items
    ids = Counter(r.trajectory_id for r in results)
    expected = {p.key for _, p in jobs}
    record = {
        "n": args.n, "in_flight_limit": args.in_flight, "wall_s": round(wall, 1),
        "first_result_s": round(arrivals[0], 1), "last_result_s": round(arrivals[-1], 1),
        "cleanup_s": round(wall - arrivals[-1], 1),
        "quorum_s": round(arrivals[math.ceil(args.quorum * args.n - 1e-9) - 1], 1),
        "statuses": dict(Counter(r.status.value for r in results)),
        "each_exactly_once": (
            set(ids) == expected and all(c == 1 for c in ids.values()) and len(results) == args.n
        ),
        "pods_left": len(pods), "configmaps_left": len(cms),
        "requests": stats.requests, "requests_per_evaluation": round(stats.requests / args.n, 3),
        "delete_requests": stats.delete_requests, "achieved_qps": round(stats.requests / wall, 1),
        "configured_qps": args.qps, "client_429s": stats.throttled, "min_rate": round(stats.min_rate, 1),
        "peak_in_flight": stats.peak_in_flight, "pods_created": stats.pods_created,
        "stragglers_cut": stats.stragglers_cut, "log_reads": stats.log_reads,
        "watch_relists": stats.watch_relists, "watch_reconnects": stats.watch_reconnects,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "results": {r.trajectory_id: [r.status.value, (r.reason or "")[:80]] for r in results},
    }  # fmt: skip
    print(json.dumps(record), flush=True)


# -- the driver --------------------------------------------------------------------------------------

INFRA_FATES = {"never_scheduled", "pull_failure", "evicted", "killed"}


def check_against_decisions(record: dict, decisions: Path) -> dict:
    """How many results match what the simulator decided for their pod (or were cut as stragglers)."""
    fates = {}
    for line in decisions.read_text().splitlines():
        entry = json.loads(line)
        fates[entry["key"]] = entry["fate"]
    mismatched, cut = [], 0
    record["fates"] = dict(Counter(fates.values()))
    for key, (status, reason) in record.pop("results").items():
        fate = fates.get(key)
        if "straggler" in reason or "step deadline" in reason:
            cut += 1
            ok = status == "infra_error"
        elif fate is None:
            ok = status == "infra_error"  # never created (API error): must be infra_error
        elif fate in INFRA_FATES:
            ok = status == "infra_error"
        else:
            ok = status == fate
        if not ok:
            mismatched.append((key, fate, status, reason))
    return {"matching_decisions": len(mismatched) == 0, "mismatched": mismatched[:5], "cut_by_policy": cut}


def run_scenario(plane: ControlPlane, args: argparse.Namespace, name: str, n: int, faults: bool) -> dict:
    work = plane.root
    decisions = work / f"decisions-{name}.jsonl"
    decisions.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(HERE.parent / "src")}
    rates = ["--never-scheduled", "0.05", "--pull-failure", "0.30", "--evicted", "0.02", "--killed", "0.05"]
    rates = rates if faults else []
    sim_log = open(work / f"sim-{name}.log", "wb")  # noqa: SIM115 - the simulator writes it
    sim = subprocess.Popen(
        [sys.executable, __file__, "simulate", "--kubeconfig", str(plane.kubeconfig(NODE_USER)),
         "--decisions", str(decisions), "--seed", str(n), *rates],
        env=env, stdout=subprocess.PIPE, stderr=sim_log, text=True,
    )  # fmt: skip
    try:
        assert sim.stdout is not None
        sim.stdout.readline()  # "simulator: ready"
        rejected_before = server_rejections(plane)
        quorum = ["--quorum", "0.95", "--straggler-wait-s", str(args.straggler_wait_s)] if faults else []
        proc = subprocess.run(
            ["nice", "-n", "10", sys.executable, __file__, "evaluate",
             "--kubeconfig", str(plane.kubeconfig(BACKEND_USER)), "--n", str(n),
             "--in-flight", str(min(n, args.in_flight)), "--qps", str(args.qps), "--burst", str(args.burst),
             "--api-workers", str(args.api_workers), "--start-deadline-s", str(args.start_deadline_s),
             "--group-size", str(args.group_size), *quorum],
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"evaluate failed:\n{proc.stderr[-3000:]}")
        record = json.loads(proc.stdout.strip().splitlines()[-1])
        record["server_429s"] = server_rejections(plane) - rejected_before
    finally:
        sim.send_signal(signal.SIGTERM)
        sim.wait(10)
    record.update(check_against_decisions(record, decisions))
    record["scenario"] = name
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    sim = sub.add_parser("simulate")
    sim.add_argument("--kubeconfig", required=True)
    sim.add_argument("--decisions", required=True)
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--workers", type=int, default=16)
    sim.add_argument("--schedule-s", type=float, default=0.2, help="median bind latency")
    sim.add_argument("--start-s", type=float, default=2.0, help="median bound -> Running (image pull, start)")
    sim.add_argument("--run-s", type=float, default=5.0, help="median Running -> ended")
    sim.add_argument("--sigma", type=float, default=0.6, help="log-normal sigma of start and run latencies")
    sim.add_argument("--never-scheduled", type=float, default=0.0)
    sim.add_argument("--pull-failure", type=float, default=0.0)
    sim.add_argument("--evicted", type=float, default=0.0)
    sim.add_argument(
        "--killed", type=float, default=0.0, help="share of pods whose runner is killed mid-group"
    )
    sim.add_argument("--pass-rate", type=float, default=0.5)
    ev = sub.add_parser("evaluate")
    ev.add_argument("--kubeconfig", required=True)
    ev.add_argument("--n", type=int, required=True)
    ev.add_argument("--in-flight", type=int, required=True)
    for sp in (parser, ev):
        sp.add_argument("--qps", type=float, default=100.0, help="the client's configured request rate")
        sp.add_argument("--burst", type=int, default=50)
        sp.add_argument("--api-workers", type=int, default=16)
        sp.add_argument("--start-deadline-s", type=float, default=120.0)
        sp.add_argument("--straggler-wait-s", type=float, default=10.0)
        sp.add_argument("--group-size", type=int, default=8, help="evaluations of one task per pod")
    ev.add_argument("--quorum", type=float, default=1.0)
    parser.add_argument("--scales", default="1000,10000,41000", help='comma-separated; "" for none')
    parser.add_argument(
        "--faults", action="store_true", help="also run the largest scale up to 1,000 with faults"
    )
    parser.add_argument("--fault-n", type=int, default=1000)
    parser.add_argument("--in-flight", type=int, default=10_000, help="the backend's max_concurrency")
    parser.add_argument("--inflight", type=int, default=20, help="kube-apiserver --max-requests-inflight")
    parser.add_argument(
        "--mutating", type=int, default=10, help="kube-apiserver --max-mutating-requests-inflight"
    )
    parser.add_argument(
        "--seats", type=int, default=10, help="assuredConcurrencyShares of the backend's level"
    )
    parser.add_argument("--queue-length", type=int, default=4)
    parser.add_argument("--api-port", type=int, default=26443)
    parser.add_argument("--etcd-port", type=int, default=23990)
    parser.add_argument("--work", default=str(HERE.parent / ".work" / "k8s-scale"))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.command == "simulate":
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        simulate(args)
        return
    if args.command == "evaluate":
        evaluate(args)
        return
    plane = ControlPlane(Path(args.work), args.api_port, args.etcd_port, args.inflight, args.mutating)
    plane.start()
    records = []
    try:
        admin = api_client(plane.kubeconfig(NODE_USER), 4)
        apply_flow_control(admin, args.seats, queues=8, hand=2, queue_length=args.queue_length)
        print(f"load: {os.getloadavg()}; kube-apiserver --max-requests-inflight {args.inflight} "
              f"--max-mutating-requests-inflight {args.mutating}; level shares {args.seats}",
              flush=True)  # fmt: skip
        scenarios = [(f"n{n}", n, False) for n in map(int, filter(None, args.scales.split(",")))]
        if args.faults:  # before the largest scale
            scenarios.insert(len(scenarios) - 1, (f"faults-n{args.fault_n}", args.fault_n, True))
        for name, n, faults in scenarios:
            record = run_scenario(plane, args, name, n, faults)
            record["load_after"] = [round(x, 2) for x in os.getloadavg()]
            records.append(record)
            print(json.dumps(record), flush=True)
    finally:
        plane.stop()
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
