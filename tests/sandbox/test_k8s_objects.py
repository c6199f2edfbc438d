"""The objects the Kubernetes backend builds: schema-valid (strict), restricted, labelled, size-checked."""

from __future__ import annotations

import json
import re

import kubernetes_validate
import pytest
import yaml

from fixtures.calc import GOLD, calc_task
from gagar.sandbox.base import Prediction
from gagar.sandbox.k8s import (
    KubernetesSandboxConfig,
    ObjectTooLargeError,
    build_code_configmap,
    build_configmap,
    build_network_policy,
    build_pod,
    plan_pod,
    render_objects_yaml,
    to_dict,
)
from gagar.sandbox.k8s.objects import code_configmap_name, pod_deadline_s
from gagar.schema.task import Task

K8S_VERSION = "1.30.0"


def bundled_task() -> Task:
    return calc_task()


def swebench_task() -> Task:
    return Task(
        instance_id="astropy__astropy-12907",
        repo="astropy/astropy",
        base_commit="d16bfe05a744909de4b27f5875fe0d4ed41ce607",
        problem_statement="separability matrix",
        patch=GOLD,
        test_patch="",
        FAIL_TO_PASS='["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"]',
        environment="swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest",
        test_cmd="pytest -rA astropy/modeling/tests/test_separable.py",
    )


CONFIGS = [
    KubernetesSandboxConfig(image="registry.example/gagar-sandbox:py311"),
    KubernetesSandboxConfig(
        image="registry.example/gagar-sandbox:py311",
        runtime_class_name="gvisor",
        service_account_name="gagar-sandbox",
        labels={"team.example.com/owner": "rl"},
    ),
]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("task_factory", [bundled_task, swebench_task])
def test_objects_validate_strictly(config: KubernetesSandboxConfig, task_factory) -> None:
    task = task_factory()
    plan = plan_pod(
        config, "a1b2c3d4e5f6", 3, task, [Prediction(instance_id=task.instance_id, model_patch=GOLD)]
    )
    for obj in (
        build_pod(config, plan),
        build_configmap(config, plan),
        build_code_configmap(config, plan.run_id),
        build_network_policy(config, plan.run_id),
    ):
        kubernetes_validate.validate(to_dict(obj), K8S_VERSION, strict=True)


def test_strict_validation_catches_a_bad_field() -> None:
    """The check above can fail: a misspelt field is refused in strict mode."""
    config = CONFIGS[0]
    plan = plan_pod(config, "a1b2c3d4e5f6", 0, bundled_task(), [Prediction(instance_id="demo__calc-1")])
    pod = to_dict(build_pod(config, plan))
    pod["spec"]["automountServiceAcountToken"] = False
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_pod_meets_the_restricted_profile() -> None:
    config = CONFIGS[1]
    task = swebench_task()
    plan = plan_pod(config, "a1b2c3d4e5f6", 0, task, [Prediction(instance_id=task.instance_id)])
    pod = to_dict(build_pod(config, plan))
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] == pod_deadline_s(config, 1)
    assert spec["runtimeClassName"] == "gvisor"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not any(key in spec for key in ("hostNetwork", "hostPID", "hostIPC"))
    (container,) = spec["containers"]
    assert container["image"] == task.environment.image
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["runAsUser"] > 0
    assert set(container["resources"]["limits"]) == {"cpu", "memory", "ephemeral-storage"}
    assert set(container["resources"]["requests"]) == {"cpu", "memory", "ephemeral-storage"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["workspace"]["emptyDir"]["sizeLimit"] == config.resources.workspace_size
    assert volumes["tmp"]["emptyDir"]["sizeLimit"] == config.resources.tmp_size
    projected = [source["configMap"]["name"] for source in volumes["input"]["projected"]["sources"]]
    assert projected == [code_configmap_name(plan.run_id), pod["metadata"]["name"]]
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["command"][-2:] == ["/dev/termination-log", "/tmp"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["input"]["readOnly"] is True


def test_labels_are_hashed_and_valid_for_long_ids() -> None:
    config = CONFIGS[1]
    long_key = "trajectory/" + "x" * 300
    pred = Prediction(instance_id="demo__calc-1", trajectory_id=long_key)
    plan = plan_pod(config, "a1b2c3d4e5f6", 0, bundled_task(), [pred])
    meta = to_dict(build_pod(config, plan))["metadata"]
    labels = meta["labels"]
    assert labels["app.kubernetes.io/name"] == "gagar-sandbox"
    assert labels["app.kubernetes.io/managed-by"] == "gagar"
    assert labels["gagar.dev/run"] == "a1b2c3d4e5f6"
    assert labels["team.example.com/owner"] == "rl"
    assert all(re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", v) for v in labels.values())
    assert json.loads(meta["annotations"]["gagar.dev/keys"]) == [long_key]
    assert len(meta["name"]) <= 63
    other = plan_pod(config, "a1b2c3d4e5f6", 1, bundled_task(), [pred])
    assert other.name != plan.name


def test_network_policy_denies_all_traffic_to_sandbox_pods() -> None:
    policy = to_dict(build_network_policy(CONFIGS[0], "a1b2c3d4e5f6"))
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "gagar-sandbox"}}
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in spec
    assert "egress" not in spec


def test_configmap_carries_inputs_and_refuses_past_one_mib() -> None:
    config = CONFIGS[0]
    task = bundled_task()
    plan = plan_pod(
        config, "a1b2c3d4e5f6", 0, task, [Prediction(instance_id=task.instance_id, model_patch=GOLD)]
    )
    data = to_dict(build_configmap(config, plan))["data"]
    assert set(data) == {"spec.json", "model-0.patch", "test.patch", "snapshot.json"}
    assert data["model-0.patch"] == GOLD
    assert json.loads(data["spec.json"])["patches"] == ["model-0.patch"]
    code = to_dict(build_code_configmap(config, plan.run_id))
    assert set(code["data"]) == {
        "runner.py",
        "gagar_patch.py",
        "gagar_pristine.py",
        "gagar_judge_plugin.py",
        "gagar_judge_monitor.py",
        "gagar_forkserver.py",
        "pytest.ini",
    }
    assert code["metadata"]["labels"]["gagar.dev/run"] == plan.run_id

    huge = Prediction(instance_id=task.instance_id, model_patch="+" * (1 << 20))
    with pytest.raises(ObjectTooLargeError, match=r"model-0\.patch") as err:
        build_configmap(config, plan_pod(config, "a1b2c3d4e5f6", 0, task, [huge]))
    assert err.value.policy_fault

    big_task = task.model_copy(update={"snapshot": {"blob.txt": "y" * (1 << 20)}})
    with pytest.raises(ObjectTooLargeError, match=r"snapshot\.json") as err:
        build_configmap(config, plan_pod(config, "a1b2c3d4e5f6", 0, big_task, [Prediction(instance_id="x")]))
    assert not err.value.policy_fault


def test_task_without_any_image_is_refused() -> None:
    with pytest.raises(ValueError, match=r"no environment\.image"):
        plan_pod(KubernetesSandboxConfig(), "a1b2c3d4e5f6", 0, bundled_task(), [Prediction(instance_id="x")])


def test_render_yaml_gives_four_valid_documents() -> None:
    task = bundled_task()
    text = render_objects_yaml(task, Prediction(instance_id=task.instance_id, model_patch=GOLD), CONFIGS[0])
    docs = list(yaml.safe_load_all(text))
    assert [d["kind"] for d in docs] == ["NetworkPolicy", "ConfigMap", "ConfigMap", "Pod"]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_config_rejects_invalid_labels_and_namespace() -> None:
    with pytest.raises(ValueError, match="label value"):
        KubernetesSandboxConfig(labels={"team": "not valid!"})
    with pytest.raises(ValueError, match="DNS-1123"):
        KubernetesSandboxConfig(namespace="Bad_NS")
