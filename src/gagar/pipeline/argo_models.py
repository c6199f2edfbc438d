"""Checks of compiled Argo manifests: the argo-workflows SDK's models and Kubernetes' pod schema.

:func:`to_model` reads a Workflow or CronWorkflow manifest into the SDK's typed model, refusing
wrong types and fields the model does not know (the SDK itself would keep them silently);
:func:`to_manifest` writes it back, so ``to_manifest(to_model(m)) == m`` shows nothing is lost.
:func:`pod_manifests` assembles the pod each container template runs as (workflow-level security
context, volumes and account, the template's container) for ``kubernetes-validate``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ArgoSchemaError", "pod_manifests", "to_manifest", "to_model", "unknown_fields", "validate_pods"]


class ArgoSchemaError(ValueError):
    """A manifest the argo-workflows SDK models or the Kubernetes pod schema refuse."""


def _model_class(kind: str) -> type:
    from argo_workflows.model.io_argoproj_workflow_v1alpha1_cron_workflow import (
        IoArgoprojWorkflowV1alpha1CronWorkflow,
    )
    from argo_workflows.model.io_argoproj_workflow_v1alpha1_workflow import IoArgoprojWorkflowV1alpha1Workflow

    classes = {
        "Workflow": IoArgoprojWorkflowV1alpha1Workflow,
        "CronWorkflow": IoArgoprojWorkflowV1alpha1CronWorkflow,
    }
    if kind not in classes:
        raise ArgoSchemaError(f"kind {kind!r} is neither Workflow nor CronWorkflow")
    return classes[kind]


def unknown_fields(model: Any, path: str = "") -> list[str]:
    """Paths of the fields inside an SDK model that its schema does not declare."""
    from argo_workflows.model_utils import OpenApiModel

    found: list[str] = []
    if isinstance(model, OpenApiModel):
        declared = type(model).attribute_map
        for name, value in model._data_store.items():
            where = f"{path}.{declared.get(name, name)}"
            if name not in declared:
                found.append(where.lstrip("."))
            found += unknown_fields(value, where)
    elif isinstance(model, list):
        for index, item in enumerate(model):
            found += unknown_fields(item, f"{path}[{index}]")
    return found


def to_model(manifest: dict[str, Any]) -> Any:
    """The SDK model of a Workflow or CronWorkflow manifest.

    Raises:
        ArgoSchemaError: a wrong kind, a missing or mistyped field, or a field the schema lacks.
    """
    import copy

    from argo_workflows.configuration import Configuration
    from argo_workflows.exceptions import OpenApiException
    from argo_workflows.model_utils import validate_and_convert_types

    cls = _model_class(str(manifest.get("kind")))
    try:
        model = validate_and_convert_types(
            copy.deepcopy(manifest), (cls,), ["manifest"], True, True, configuration=Configuration()
        )
    except (OpenApiException, TypeError) as exc:
        raise ArgoSchemaError(f"{manifest.get('kind')}: {exc}") from None
    unknown = unknown_fields(model)
    if unknown:
        raise ArgoSchemaError(
            f"{manifest['kind']}: fields the Argo schema does not declare: {', '.join(unknown)}"
        )
    return model


def to_manifest(model: Any) -> dict[str, Any]:
    """The manifest (plain JSON types, the API's field names) of an SDK model."""
    from argo_workflows.api_client import ApiClient

    manifest: dict[str, Any] = ApiClient.sanitize_for_serialization(model)
    return manifest


def _workflow_spec(manifest: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = manifest["spec"]
    return spec["workflowSpec"] if manifest["kind"] == "CronWorkflow" else spec


def pod_manifests(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The Pod each container template of a Workflow or CronWorkflow runs as (Argo's sidecars aside)."""
    spec = _workflow_spec(manifest)
    name = manifest["metadata"].get("name") or manifest["metadata"].get("generateName", "workflow-")
    pods = []
    for template in spec["templates"]:
        if "container" not in template:
            continue
        labels = {
            **spec.get("podMetadata", {}).get("labels", {}),
            **template.get("metadata", {}).get("labels", {}),
        }
        pod: dict[str, Any] = {
            "restartPolicy": "Never",
            "containers": [template["container"]],
            **{key: spec[key] for key in ("securityContext", "volumes", "serviceAccountName") if key in spec},
        }
        if "serviceAccountName" in template:
            pod["serviceAccountName"] = template["serviceAccountName"]
        if "activeDeadlineSeconds" in template:
            pod["activeDeadlineSeconds"] = int(template["activeDeadlineSeconds"])
        metadata = {"name": f"{name.rstrip('-')}-{template['name']}", "labels": labels}
        pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod})
    return pods


def validate_pods(manifest: dict[str, Any], kube_version: str = "1.30.0") -> int:
    """Validate every :func:`pod_manifests` pod with kubernetes-validate (strict); returns how many.

    Raises:
        ArgoSchemaError: a pod the Kubernetes schema refuses, naming the template.
    """
    import kubernetes_validate

    pods = pod_manifests(manifest)
    for pod in pods:
        try:
            kubernetes_validate.validate(pod, kube_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise ArgoSchemaError(f"pod of template {pod['metadata']['name']}: {exc.message}") from None
    return len(pods)
