"""One pod per group: several trajectories of one task judged in one pod, each in its own isolated
child; results streamed; deletes batched; a pod lost mid-group costs exactly its evaluations.

The pods run the real in-pod runner through ``FakeCluster`` (see ``test_k8s_backend``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_k8s_backend import GOLD, FakeCluster, assert_clean, config, pred, task

from gagar.sandbox.k8s import KubernetesBackend, pack, plan_pod
from gagar.sandbox.k8s.objects import build_code_configmap, build_configmap
from gagar.sandbox.k8s.outcome import decode_result, parse_summary
from gagar.sandbox.limits import SandboxLimits
from gagar.sandbox.patch import file_diff
from gagar.schema.result import Status

SOURCE = "def add(a, b):\n    return a - b\n"
HOSTILE_BODY = (  # leaves files in /tmp, /dev/shm and ahead in the workspace, and a process that
    # keeps writing and tries to kill the runner; add() itself is right
    "import os\nimport signal\nimport tempfile\nimport time\n\n"
    "HERE, TMP = os.path.dirname(os.path.abspath(__file__)), tempfile.gettempdir()\n"
    "AHEAD = [HERE + '/../../e%d/poison' % k for k in range(16)]\n"
    "for target in [TMP + '/poison', '/dev/shm/poison', HERE + '/../../poison', *AHEAD]:\n"
    "    try:\n"
    "        os.makedirs(os.path.dirname(target), exist_ok=True)\n"
    "        with open(target, 'w') as fh:\n"
    "            fh.write('x')\n"
    "    except OSError:\n"
    "        pass\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    for _ in range(600):\n"
    "        for pid in os.listdir('/proc'):\n"
    "            try:\n"
    "                with open('/proc/' + pid + '/cmdline', 'rb') as fh:\n"
    "                    line = fh.read()\n"
    "                if b'runner.py' in line and int(pid) != os.getpid():\n"
    "                    os.kill(int(pid), signal.SIGKILL)\n"
    "            except (OSError, ValueError):\n"
    "                pass\n"
    "        try:\n"
    "            with open(TMP + '/poison', 'w') as fh:\n"
    "                fh.write('late')\n"
    "        except OSError:\n"
    "            pass\n"
    "        time.sleep(0.05)\n"
    "    os._exit(0)\n\n\n"
    "def add(a, b):\n    return a + b\n"
)
CHECKER_BODY = (  # right only if nothing of an earlier evaluation is visible
    "import os\nimport tempfile\n\n"
    "HERE, TMP = os.path.dirname(os.path.abspath(__file__)), tempfile.gettempdir()\n"
    "SEEN = [p for p in (TMP + '/poison', '/dev/shm/poison', HERE + '/../poison', HERE + '/../../poison')\n"
    "        if os.path.exists(p)]\n\n\n"
    "def add(a, b):\n    return a + b + len(SEEN)\n"
)
HOSTILE = file_diff("calc.py", SOURCE, HOSTILE_BODY)
CHECKER = file_diff("calc.py", SOURCE, CHECKER_BODY)
CONFTEST = file_diff(
    "conftest.py",
    None,
    "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n",
)
SPIN = file_diff("calc.py", SOURCE, "def add(a, b):\n    while True:\n        pass\n")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from([None, "img"])), max_size=40),
    st.integers(1, 9),
)
def test_pack_puts_each_job_once_in_a_pod_of_one_task_and_image(keys: list, size: int) -> None:
    jobs = [(i, task(image or "local/python", instance_id=name), pred(GOLD, str(i))) for i, (name, image) in
            enumerate(keys)]  # fmt: skip
    groups = pack(jobs, size)
    assert sorted(p for g in groups for p in g) == list(range(len(jobs)))
    for group in groups:
        assert 1 <= len(group) <= size
        assert group == sorted(group)
        assert len({(jobs[p][1].instance_id, jobs[p][1].environment.image) for p in group}) == 1
    assert len(groups) == sum(-(-sum(1 for k in keys if k == key) // size) for key in set(keys))


def test_a_group_shares_one_pod_and_a_hostile_member_leaves_its_neighbours_alone() -> None:
    """Files in /tmp, /dev/shm and ahead in the workspace, a detached process that keeps
    writing and tries to kill the runner: the checker after it sees none of it, and the
    neighbours' verdicts are what they are alone."""
    jobs = [
        (task(), pred(GOLD, "gold-1")),
        (task(), pred(HOSTILE, "hostile")),
        (task(), pred(CHECKER, "checker")),
        (task(), pred(CONFTEST, "conftest")),
        (task(), pred("", "empty")),
        (task(), pred(GOLD, "gold-2")),
    ]
    cluster = FakeCluster()
    backend = KubernetesBackend(config(), cluster, cluster)
    results = {r.trajectory_id: r for r in backend.evaluate(jobs)}
    assert cluster.calls.count("create_namespaced_pod") == 1
    for key in ("gold-1", "checker", "gold-2"):
        assert (results[key].status, results[key].resolved) == (Status.PASSED, True), results[key]
    assert results["conftest"].status == Status.HACK
    assert results["empty"].status == Status.FAILED
    assert not results["hostile"].resolved
    assert "delete_namespaced_pod" not in cluster.calls  # deleted with one request per kind
    assert_clean(cluster)


def test_an_evaluation_past_its_deadline_is_a_timeout_and_its_neighbours_finish() -> None:
    cluster = FakeCluster()
    backend = KubernetesBackend(config(limits=SandboxLimits(wall_time_s=3.0)), cluster, cluster)
    before, spin, after = backend.evaluate(
        [(task(), pred(GOLD, "before")), (task(), pred(SPIN, "spin")), (task(), pred(GOLD, "after"))]
    )
    assert spin.status == Status.TIMEOUT, spin
    assert "deadline" in (spin.reason or "")
    assert (before.status, after.status) == (Status.PASSED, Status.PASSED)
    assert_clean(cluster)


def test_a_pod_killed_mid_group_is_infra_error_for_exactly_its_evaluations() -> None:
    cluster = FakeCluster()
    backend = KubernetesBackend(config(), cluster, cluster)
    killed = task("fault/killed", instance_id="demo__killed")
    jobs = [(killed, pred(GOLD, f"k{i}")) for i in range(3)] + [
        (task(), pred(GOLD, f"g{i}")) for i in range(2)
    ]
    results = backend.evaluate(jobs)
    assert [r.status for r in results] == [Status.INFRA_ERROR] * 3 + [Status.PASSED] * 2
    assert all("did not finish" in (r.reason or "") for r in results[:3])
    assert backend.last_run.pods_created == 2
    assert_clean(cluster)


def test_work_is_taken_while_earlier_pods_run_and_results_stream() -> None:
    cluster = FakeCluster()
    backend = KubernetesBackend(config(), cluster, cluster)
    with backend.session() as run:
        first = run.submit([(task(), pred(GOLD, "a")), (task(), pred("", "b"))])
        stream = run.results()
        got = dict(next(stream) for _ in first)  # back before any later work exists
        second = run.submit([(task(instance_id="demo__calc-2"), pred(GOLD, "c"))])
        run.close()
        got.update(stream)
    assert (list(first), list(second)) == ([0, 1], [2])
    assert [got[i].trajectory_id for i in range(3)] == ["a", "b", "c"]
    assert [got[i].status for i in range(3)] == [Status.PASSED, Status.FAILED, Status.PASSED]
    with pytest.raises(RuntimeError, match="after close"):
        run.submit([(task(), pred(GOLD, "late"))])
    assert_clean(cluster)


def test_requests_per_evaluation_fall_with_the_group() -> None:
    """16 evaluations of one task: 2 pods, 2 input ConfigMaps, no per-pod delete or GET."""
    cluster = FakeCluster()
    backend = KubernetesBackend(config(group_size=8), cluster, cluster)
    results = backend.evaluate([(task(), pred(GOLD if i % 2 else "", f"t{i}")) for i in range(16)])
    assert [r.status for r in results] == [Status.FAILED, Status.PASSED] * 8
    assert cluster.calls.count("create_namespaced_pod") == 2
    assert cluster.calls.count("create_namespaced_config_map") == 3  # the run's code, then one per pod
    assert not {"delete_namespaced_pod", "read_namespaced_pod", "read_namespaced_pod_log"} & set(
        cluster.calls
    )
    assert backend.last_run.requests <= 16 * 0.5 + 12  # the run's own: sweep, policy, code, watch, cleanup
    assert_clean(cluster)


def test_a_group_too_large_for_one_configmap_is_split() -> None:
    cluster = FakeCluster()
    backend = KubernetesBackend(config(max_patch_bytes=600_000), cluster, cluster)
    big = GOLD + file_diff("notes.txt", None, "x" * 79 + "\n" * 1 + ("y" * 79 + "\n") * 5000)
    results = backend.evaluate([(task(), pred(big, f"b{i}")) for i in range(3)])
    assert [r.status for r in results] == [Status.PASSED] * 3, results
    assert cluster.calls.count("create_namespaced_pod") == 3
    assert_clean(cluster)


def test_each_evaluation_of_a_group_runs_in_fresh_namespaces_here(tmp_path: Path) -> None:
    """Where the kernel lets the runner create namespaces (this host; a pod whose seccomp allows it),
    each child gets the local forkserver's isolation; the reference travels once."""
    cfg = config()
    plan = plan_pod(cfg, "0" * 12, 0, task(), [pred(GOLD, "a"), pred("", "b")])
    inputs, workspace, tmp = tmp_path / "input", tmp_path / "workspace", tmp_path / "tmp"
    for folder in (inputs, workspace, tmp):
        folder.mkdir()
    for name, text in {**build_code_configmap(cfg, "0" * 12).data, **build_configmap(cfg, plan).data}.items():
        (inputs / name).write_text(text)
    argv = [
        sys.executable,
        str(inputs / "runner.py"),
        str(inputs),
        str(workspace),
        str(tmp_path / "msg"),
        str(tmp),
    ]
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=True).stdout
    group = parse_summary(out, plan.nonce)
    assert group is not None, out
    assert [s["stage"] for s in group["results"]] == ["done", "done"]
    assert all(s["isolation"] == "namespaces" for s in group["results"]), group["results"]
    assert "reference" in group
    assert all("reference" not in s for s in group["results"])
    assert decode_result((tmp_path / "msg").read_text(), plan.nonce, 1 << 20) == group
    assert not list(workspace.iterdir())


def test_a_memory_bomb_hits_its_own_limit_and_its_neighbour_passes() -> None:
    bomb = file_diff(
        "calc.py",
        SOURCE,
        "def add(a, b):\n    hog = []\n    while True:\n        hog.append(bytearray(1 << 26))\n",
    )
    cluster = FakeCluster()
    backend = KubernetesBackend(config(limits=SandboxLimits(memory_bytes=768 << 20)), cluster, cluster)
    bombed, gold = backend.evaluate([(task(), pred(bomb, "bomb")), (task(), pred(GOLD, "gold"))])
    assert bombed.status == Status.FAILED, bombed
    assert "MemoryError" in bombed.log
    assert gold.status == Status.PASSED, gold
    assert_clean(cluster)


def test_an_output_flood_is_stopped_at_its_limit_and_its_neighbour_passes() -> None:
    flood = file_diff(
        "calc.py",
        SOURCE,
        "import os\n\n\ndef add(a, b):\n    while True:\n        os.write(1, b'x' * 65536)\n",
    )
    cluster = FakeCluster()
    backend = KubernetesBackend(config(limits=SandboxLimits(max_output_bytes=4 << 20)), cluster, cluster)
    flooded, gold = backend.evaluate([(task(), pred(flood, "flood")), (task(), pred(GOLD, "gold"))])
    assert flooded.status == Status.ERROR, flooded
    assert "output exceeded" in (flooded.reason or "")
    assert gold.status == Status.PASSED, gold
    assert_clean(cluster)
