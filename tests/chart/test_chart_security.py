"""Security properties: restricted sandbox namespace, no network, hardened pods, namespace-scoped RBAC."""

from __future__ import annotations

from typing import Any

from chart_render import NAMESPACE, RELEASE, by_kind, pod_specs, render_objects, scenario_values

SANDBOX_NAMESPACE = f"{RELEASE}-sandbox"


def _named(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in by_kind(objs, kind) if o["metadata"]["name"] == name]
    assert len(matches) == 1, (kind, name, [o["metadata"]["name"] for o in by_kind(objs, kind)])
    return matches[0]


def test_sandbox_namespace_enforces_the_restricted_standard() -> None:
    namespace = _named(render_objects(), "Namespace", SANDBOX_NAMESPACE)
    labels = namespace["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"


def test_sandbox_namespace_name_is_configurable_and_can_preexist() -> None:
    objs = render_objects(scenario_values("external-s3"))
    assert by_kind(objs, "Namespace") == []
    policy = by_kind(objs, "NetworkPolicy")[0]
    assert policy["metadata"]["namespace"] == "gagar-sandbox"


def test_sandbox_network_policy_denies_all_ingress_and_egress() -> None:
    objs = render_objects()
    (policy,) = by_kind(objs, "NetworkPolicy")
    assert policy["metadata"]["namespace"] == SANDBOX_NAMESPACE
    spec = policy["spec"]
    assert spec["podSelector"] == {}
    assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]
    assert "ingress" not in spec
    assert "egress" not in spec


def test_sandbox_quota_and_limits_live_in_the_sandbox_namespace() -> None:
    objs = render_objects()
    (quota,) = by_kind(objs, "ResourceQuota")
    (limits,) = by_kind(objs, "LimitRange")
    assert quota["metadata"]["namespace"] == limits["metadata"]["namespace"] == SANDBOX_NAMESPACE
    assert quota["spec"]["hard"]["pods"] == "64"
    assert limits["spec"]["limits"][0]["default"]["memory"] == "2Gi"


def test_every_pod_runs_hardened(scenario_objects: list[dict[str, Any]]) -> None:
    for name, spec in pod_specs(scenario_objects):
        pod_ctx = spec["securityContext"]
        assert pod_ctx["runAsNonRoot"] is True, name
        assert pod_ctx["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert spec["automountServiceAccountToken"] is False, name
        for container in spec.get("initContainers", []) + spec["containers"]:
            ctx = container["securityContext"]
            where = (name, container["name"])
            assert ctx["allowPrivilegeEscalation"] is False, where
            assert ctx["readOnlyRootFilesystem"] is True, where
            assert ctx["runAsNonRoot"] is True, where
            assert ctx["capabilities"] == {"drop": ["ALL"]}, where
            assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert "privileged" not in ctx, where
            assert "resources" in container, where
        for host_namespace in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(host_namespace), (name, host_namespace)
        assert all("hostPath" not in volume for volume in spec.get("volumes", [])), name


def test_no_cluster_wide_rbac(scenario_objects: list[dict[str, Any]]) -> None:
    kinds = {o["kind"] for o in scenario_objects}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding"}
    for binding in by_kind(scenario_objects, "RoleBinding"):
        assert binding["roleRef"]["kind"] == "Role"


def test_sandbox_role_grants_only_pod_management_in_the_sandbox_namespace() -> None:
    objs = render_objects()
    role = _named(objs, "Role", f"{RELEASE}-sandbox")
    assert role["metadata"]["namespace"] == SANDBOX_NAMESPACE
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    manage = ("create", "get", "list", "watch", "delete")
    expected = {("", r, v) for r in ("pods", "configmaps") for v in (*manage, "deletecollection")}
    expected |= {("networking.k8s.io", "networkpolicies", v) for v in manage}
    expected |= {("", "pods/log", v) for v in ("get", "list", "watch")}
    assert granted == expected
    assert all("*" not in rule["verbs"] and "*" not in rule["resources"] for rule in role["rules"])


def test_sandbox_and_runner_roles_are_bound_to_the_release_account_and_kfps_run_accounts() -> None:
    objs = render_objects()
    account = _named(objs, "ServiceAccount", f"{RELEASE}-runner")
    assert account["metadata"]["namespace"] == NAMESPACE
    # A run the chart schedules runs as <release>-runner; one submitted from the Kubeflow UI runs as
    # pipeline-runner (single-user KFP) or default-editor (a multi-user profile namespace).
    expected = [
        {"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}
        for name in (f"{RELEASE}-runner", "pipeline-runner", "default-editor")
    ]
    binding = _named(objs, "RoleBinding", f"{RELEASE}-sandbox")
    assert binding["metadata"]["namespace"] == SANDBOX_NAMESPACE
    assert binding["subjects"] == expected
    assert _named(objs, "RoleBinding", f"{RELEASE}-runner")["subjects"] == expected


def test_kfp_run_accounts_follow_the_release_namespace_and_can_be_turned_off() -> None:
    objs = render_objects(name="rl", namespace="team-ml")
    binding = _named(objs, "RoleBinding", "rl-gagar-sandbox")
    assert {(s["name"], s["namespace"]) for s in binding["subjects"]} == {
        ("rl-gagar-runner", "team-ml"),
        ("pipeline-runner", "team-ml"),
        ("default-editor", "team-ml"),
    }
    only_own = render_objects({"sandbox": {"rbac": {"kfpServiceAccounts": []}}})
    assert [s["name"] for s in _named(only_own, "RoleBinding", f"{RELEASE}-sandbox")["subjects"]] == [
        f"{RELEASE}-runner"
    ]


def test_extra_subjects_join_the_sandbox_binding() -> None:
    objs = render_objects(scenario_values("external-s3"))
    binding = _named(objs, "RoleBinding", f"{RELEASE}-sandbox")
    assert {(s["name"], s["namespace"]) for s in binding["subjects"]} == {
        ("gagar-pipeline", NAMESPACE),
        ("pipeline-runner", NAMESPACE),
        ("default-editor", NAMESPACE),
        ("default-editor", "team-ml"),
    }


def test_runner_role_reads_only_the_launcher_config_and_the_store_secret() -> None:
    objs = render_objects(scenario_values("external-s3"))
    role = _named(objs, "Role", f"{RELEASE}-runner")
    assert role["metadata"]["namespace"] == NAMESPACE
    by_resource = {resource: rule for rule in role["rules"] for resource in rule["resources"]}
    assert by_resource["secrets"]["resourceNames"] == ["aws-s3-credentials"]
    assert by_resource["secrets"]["verbs"] == ["get"]
    assert by_resource["configmaps"]["resourceNames"] == ["kfp-launcher"]


def test_nothing_is_rendered_outside_the_release_and_sandbox_namespaces(
    scenario_objects: list[dict[str, Any]],
) -> None:
    for obj in scenario_objects:
        if obj["kind"] in ("Namespace", "ClusterTrainingRuntime"):  # cluster-scoped by their API
            continue
        assert obj["metadata"]["namespace"] in {NAMESPACE, SANDBOX_NAMESPACE, "gagar-sandbox"}, obj["kind"]
