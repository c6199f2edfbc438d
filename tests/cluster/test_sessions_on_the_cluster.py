"""The tool-call agent's sessions on a real cluster: a pod per trajectory driven through the API.

The same commands as the local session's tests (tests/sandbox/test_sandbox_session.py): shell state
kept across commands, the editor, the visible tests, the patch; the hidden tests never enter; hostile
commands contained (network, writes outside the tree, a fork bomb, killing the shell and its parent);
every object deleted on close; and the pods of a process killed with ``kill -9`` end by themselves.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from cluster_wait import wait_until

from gagar.policy.tool_calls import SessionTools
from gagar.sandbox.k8s import KubernetesBackend, KubernetesSandboxConfig
from gagar.sandbox.k8s.session import KubernetesSession
from gagar.sandbox.limits import SandboxLimits
from gagar.sandbox.session import open_session
from gagar.sandbox.session_pod import IDLE_S

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="needs a cluster: KUBECONFIG is not set"),
]

_spec = importlib.util.spec_from_file_location(
    "session_cases", Path(__file__).parents[1] / "sandbox" / "test_sandbox_session.py"
)
cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cases)  # type: ignore[union-attr]
LIMITS = SandboxLimits(
    wall_time_s=30, cpu_time_s=20, memory_bytes=1 << 30, max_processes=32, max_file_bytes=8 << 20,
    tmp_bytes=16 << 20, max_output_bytes=1 << 20, log_chars=4000,
)  # fmt: skip


@pytest.fixture(scope="module")
def backend(fresh_namespace, sandbox_image: str) -> KubernetesBackend:
    config = KubernetesSandboxConfig(
        namespace=fresh_namespace("gagar-ses"), image=sandbox_image, limits=LIMITS, start_deadline_s=180
    )
    return KubernetesBackend(config)


def _objects(backend: KubernetesBackend, session_id: str) -> list[str]:
    ns, selector = backend.config.namespace, f"gagar.dev/run={session_id}"
    core, net = backend.core, backend.networking
    return [
        f"{kind}/{item.metadata.name}"
        for kind, items in (
            ("pod", core.list_namespaced_pod(ns, label_selector=selector).items),
            ("configmap", core.list_namespaced_config_map(ns, label_selector=selector).items),
            ("networkpolicy", net.list_namespaced_network_policy(ns, label_selector=selector).items),
        )
        for item in items
    ]


def test_a_session_edits_runs_and_diffs(backend: KubernetesBackend) -> None:
    session = open_session(backend, cases._task(), 4000)
    assert isinstance(session, KubernetesSession)
    try:
        assert session.run("export MARK=7; cd /tmp", 60) == ""  # the first command waits for the pod
        assert session.run("echo $MARK; pwd", 10) == "7\n/tmp\n"  # shell state is kept
        answer = session.edit(
            {"command": "str_replace", "path": "calc.py", "old_str": "a - b", "new_str": "a + b"}, 10
        )
        assert "a + b" in answer
        assert "1 passed" in session.run("cd /sandbox/repo && python -m pytest -q -p no:cacheprovider", 30)
        assert (
            session.run(f"grep -rs {cases.HIDDEN} / --exclude-dir=proc --exclude-dir=sys | head -3", 30) == ""
        )
        assert not session.run("ls /sandbox/repo/tests", 10).count("test_hidden")
        assert _objects(backend, session.session_id)
        patch = session.patch()
        assert "+    return a + b" in patch
        assert "test_hidden" not in patch
    finally:
        session.close()
    wait_until(lambda: not _objects(backend, session.session_id), 60, "the session's objects deleted")


def test_hostile_commands_are_contained(backend: KubernetesBackend) -> None:
    host = os.environ.get("GAGAR_TEST_HOST_ADDRESS", "10.0.0.1")
    with open_session(backend, cases._task(), 4000) as session:
        connect = f"socket.create_connection(('{host}', 22), 3); print('CONNECTED')"
        net = session.run(
            f'python3 -c "import socket; {connect}" 2>&1 | tail -1; '
            "python3 -c \"import socket; socket.socket(socket.AF_INET6); print('SOCKET')\" 2>&1 | tail -1",
            60,
        )
        assert "CONNECTED" not in net
        assert "SOCKET" not in net
        targets = "/usr/x /etc/x /x /sandbox/x /sandbox/tools/x /gagar/input/x"
        assert session.run(f"for f in {targets}; do touch $f 2>/dev/null && echo WROTE $f; done", 10) == ""
        session.run(":(){ :|:& };:", 3)
        answers = []
        while len(answers) < 4 and answers[-1:] != ["alive\n"]:  # a flooded shell times out and restarts
            answers.append(session.run("echo alive", 5))
        assert answers[-1] == "alive\n"
        assert "survived" in session.run("kill -9 1; kill -9 -1; echo survived", 10)
        assert "new shell" in session.run("kill -9 $$", 10)  # the shell itself can die: a new one starts
        assert session.run("cat calc.py", 10) == cases.CALC
        session_id = session.session_id
    wait_until(lambda: not _objects(backend, session_id), 60, "the session's objects deleted")


def test_a_killed_rollout_leaves_no_running_session(backend: KubernetesBackend, tmp_path: Path) -> None:
    """kill -9 a process with two open sessions (one running a long command, one with a command left
    in the background): both pods end by themselves; the objects are the TTL sweep's."""
    script = tmp_path / "hold.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys, time
            sys.path.insert(0, {str(Path(__file__).parents[1] / "sandbox")!r})
            from gagar.sandbox.k8s import KubernetesBackend, KubernetesSandboxConfig
            from gagar.sandbox.session import open_session
            from test_sandbox_session import _task
            config = KubernetesSandboxConfig.model_validate_json({backend.config.model_dump_json()!r})
            backend = KubernetesBackend(config)
            a, b = open_session(backend, _task(), 4000), open_session(backend, _task(), 4000)
            b.run("sleep 1000 > /dev/null 2>&1 &", 120)
            a.run("true", 120)
            print(a.name, b.name, flush=True)
            a.run("sleep 1000", 1000)
            """
        )
    )
    errors = tmp_path / "hold.err"
    with errors.open("w") as err:
        hold = subprocess.Popen(
            [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=err, text=True, env=os.environ
        )
    assert hold.stdout is not None
    names = hold.stdout.readline().split()
    assert len(names) == 2, f"the sessions did not start: {errors.read_text()[-2000:]}"
    os.kill(hold.pid, signal.SIGKILL)
    hold.wait()
    killed = time.monotonic()
    core, ns = backend.core, backend.config.namespace

    def ended() -> bool:
        return all(core.read_namespaced_pod(n, ns).status.phase in ("Succeeded", "Failed") for n in names)

    wait_until(ended, IDLE_S + 60, "the killed rollout's session pods ended")
    assert time.monotonic() - killed < IDLE_S + 60
    for name in names:
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)


def test_a_session_that_cannot_start_is_its_trajectorys_infra_error(fresh_namespace) -> None:
    """An image the node cannot pull: the conversation's tools report an ``infra_error`` naming the pod
    and the reason (the tool-call agent then ends that trajectory as ``sandbox``, judged ``infra_error``:
    tests/policy/test_policy_tool_calls.py), nothing raises, and close deletes the objects."""
    config = KubernetesSandboxConfig(
        namespace=fresh_namespace("gagar-ses-bad"), image="registry.invalid/gagar/none:0", limits=LIMITS,
        start_deadline_s=120,
    )  # fmt: skip
    backend = KubernetesBackend(config)
    opened: list[KubernetesSession] = []

    def opener(task):  # type: ignore[no-untyped-def]
        session = open_session(backend, task, 4000)
        opened.append(session)  # type: ignore[arg-type]
        return session

    tools = SessionTools(cases._task(), opener)
    tools.run("ls", 10)
    answer = tools.output()
    [session] = opened
    assert tools.infra_error is not None
    assert f"session pod {session.name} cannot start" in tools.infra_error
    assert "ErrImagePull" in tools.infra_error or "ImagePullBackOff" in tools.infra_error
    assert answer.startswith("error: the sandbox session failed")
    tools.submitted = True
    assert tools.patch == ""
    tools.close()
    wait_until(lambda: not _objects(backend, session.session_id), 60, "the failed session's objects deleted")
