"""The objects of a tool-call session on Kubernetes (gagar.sandbox.k8s.session), without a cluster:
valid, as hardened as a judge pod, a uid of their own, and never a hidden test."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest

from gagar.sandbox.k8s import KubernetesSandboxConfig
from gagar.sandbox.k8s.objects import CONFIGMAP_MAX_BYTES, to_dict
from gagar.sandbox.k8s.session import SESSION_UIDS, build_session_objects
from gagar.sandbox.shell_session import SessionError
from gagar.schema.task import Task

K8S_VERSION = "1.30.0"
HIDDEN = "HIDDEN-TEST-5b1e"
CONFIG = KubernetesSandboxConfig(image="registry.example/gagar-sandbox:py311", labels={"team": "rl"})


def _task(snapshot: dict[str, str] | None = None) -> Task:
    return Task(
        instance_id="calc-1", repo="gagar/calc",
        snapshot=snapshot if snapshot is not None else {"calc.py": "def add(a, b):\n    return a - b\n"},
        problem_statement="add subtracts", patch="",
        test_patch=f"--- /dev/null\n+++ b/tests/test_hidden.py\n@@ -0,0 +1 @@\n+# {HIDDEN}\n",
        FAIL_TO_PASS=["tests/test_hidden.py::test_add"],
    )  # fmt: skip


def test_the_objects_validate_and_carry_no_hidden_test() -> None:
    policy, configmap, pod = (to_dict(o) for o in build_session_objects(CONFIG, _task(), "00c0ffee0001"))
    for obj in (policy, configmap, pod):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        assert obj["metadata"]["labels"]["team"] == "rl"
        assert obj["metadata"]["labels"]["gagar.dev/run"] == "00c0ffee0001"
    assert HIDDEN not in json.dumps(configmap)
    assert "test_hidden" not in json.dumps(configmap)
    assert json.loads(configmap["data"]["snapshot.json"]) == _task().snapshot
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in policy["spec"]
    assert "egress" not in policy["spec"]
    assert policy["spec"]["podSelector"]["matchLabels"] == pod["metadata"]["labels"]


def test_the_pod_is_hardened_and_runs_as_a_uid_of_its_own() -> None:
    *_, pod = build_session_objects(CONFIG, _task(), "00c0ffee0002")
    spec = to_dict(pod)["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["activeDeadlineSeconds"] == CONFIG.session_deadline_s
    (container,) = spec["containers"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False
    assert CONFIG.run_as_user < sc["runAsUser"] <= CONFIG.run_as_user + SESSION_UIDS
    assert spec["securityContext"]["runAsUser"] == sc["runAsUser"]
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in container["volumeMounts"]}
    assert mounts == {
        "/gagar/input": True,
        "/sandbox/tools": True,
        "/sandbox/repo": False,
        "/sandbox/state": False,
        "/tmp": False,
    }
    pods = [build_session_objects(CONFIG, _task(), f"{i:012x}")[2] for i in range(50)]
    uids = {to_dict(p)["spec"]["securityContext"]["runAsUser"] for p in pods}
    assert len(uids) == 50


def test_inputs_past_a_configmap_and_a_task_without_image_are_refused() -> None:
    big = _task({"big.py": "x" * (CONFIGMAP_MAX_BYTES + 1)})
    with pytest.raises(SessionError, match="ConfigMap"):
        build_session_objects(CONFIG, big, "00c0ffee0003")
    with pytest.raises(SessionError, match=r"no environment\.image"):
        build_session_objects(KubernetesSandboxConfig(), _task(), "00c0ffee0004")
