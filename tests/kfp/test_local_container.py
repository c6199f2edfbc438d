"""run_local in containers: only ``<out>/kfp-root`` is mounted, so its inputs must lie there."""

from __future__ import annotations

import pytest

from gagar.pipeline.local import ContainerSettings, run_local


@pytest.mark.parametrize("outside", ["model", "tasks", "storage"])
def test_inputs_outside_the_pipeline_root_are_refused(tmp_path, outside: str) -> None:
    root = tmp_path / "out" / "kfp-root"
    arguments = {
        "model": str(root / "policy"),
        "tasks": str(root / "tasks.jsonl"),
        "storage": str(root / "store"),
    }
    arguments[outside] = str(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match=f"{outside} .* is not under .*kfp-root"):
        run_local(arguments, out=tmp_path / "out", container=ContainerSettings())


def test_object_store_uris_need_no_mount(tmp_path) -> None:
    from gagar.pipeline.local import _runner

    root = tmp_path / "kfp-root"
    root.mkdir()
    (root / "policy").mkdir(mode=0o700)
    runner = _runner(
        ContainerSettings(network_mode="host"),
        root,
        {"storage": "s3://bucket/run", "model": str(root / "policy")},
    )
    assert type(runner).__name__ == "DockerRunner"
    assert runner.container_run_args["network_mode"] == "host"
    assert (root / "policy").stat().st_mode & 0o555 == 0o555  # readable by the images' uid 1000
