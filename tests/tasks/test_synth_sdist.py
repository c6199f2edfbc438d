"""Sdist handling and mutant classification: specs, safe unpacking, layout, requirements, test lists."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from gagar.schema.result import Outcome
from gagar.tasks.synth.runner import PytestRun
from gagar.tasks.synth.sdist import (
    SdistError,
    detect_layout,
    parse_spec,
    read_requirements,
    safe_extract,
    snapshot_files,
)
from gagar.tasks.synth.tasks import classify, problem_statement, stable_passing


def test_spec_must_be_an_exact_pin() -> None:
    assert parse_spec("isodate==0.7.2") == ("isodate", "0.7.2")
    for bad in ("isodate", "isodate>=0.7", "isodate==", "==1.0", "a b==1"):
        with pytest.raises(ValueError, match="NAME==VERSION"):
            parse_spec(bad)


def _tar(path: Path, members: list[tarfile.TarInfo], data: bytes = b"x = 1\n") -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for info in members:
            if info.isfile():
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            else:
                tf.addfile(info)
    return path


def test_safe_extract_unpacks_a_regular_sdist(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "p-1.tar.gz", [tarfile.TarInfo("p-1/p.py"), tarfile.TarInfo("p-1/test_p.py")])
    root = safe_extract(archive, tmp_path / "out")
    assert root.name == "p-1"
    assert (root / "p.py").read_text() == "x = 1\n"


@pytest.mark.parametrize("name", ["../evil.py", "/abs/evil.py", "p-1/../../evil.py"])
def test_safe_extract_refuses_members_leaving_the_directory(tmp_path: Path, name: str) -> None:
    archive = _tar(tmp_path / "p.tar.gz", [tarfile.TarInfo(name)])
    with pytest.raises(SdistError, match="leave the extraction directory"):
        safe_extract(archive, tmp_path / "out")
    assert not (tmp_path / "evil.py").exists()


def test_safe_extract_refuses_links(tmp_path: Path) -> None:
    link = tarfile.TarInfo("p-1/link")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    archive = _tar(tmp_path / "p.tar.gz", [tarfile.TarInfo("p-1/p.py"), link])
    with pytest.raises(SdistError, match="not a regular file"):
        safe_extract(archive, tmp_path / "out")


def test_safe_extract_checks_zip_members(tmp_path: Path) -> None:
    archive = tmp_path / "p.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("../evil.py", "x = 1\n")
    with pytest.raises(SdistError, match="leave the extraction directory"):
        safe_extract(archive, tmp_path / "out")


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_layout_of_a_src_project_with_a_tests_folder(tmp_path: Path) -> None:
    root = _write(
        tmp_path,
        {
            "src/lib/__init__.py": "",
            "src/lib/core.py": "",
            "tests/test_core.py": "",
            "tests/helpers.py": "",
            "setup.py": "",
            "docs/conf.py": "",
        },
    )
    layout = detect_layout(root)
    assert layout.source_root == "src"
    assert layout.package_files == ("src/lib/__init__.py", "src/lib/core.py")
    assert layout.test_targets == ("tests",)


def test_layout_of_a_flat_project_with_tests_inside_the_package(tmp_path: Path) -> None:
    root = _write(tmp_path, {"lib/__init__.py": "", "lib/tests/test_a.py": "", "test_top.py": ""})
    layout = detect_layout(root)
    assert layout.source_root == "."
    assert layout.package_files == ("lib/__init__.py",)
    assert layout.test_targets == ("lib/tests", "test_top.py")


def test_a_project_without_tests_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SdistError, match="no test files"):
        detect_layout(_write(tmp_path, {"lib/__init__.py": ""}))


def test_requirements_skip_extras_and_keep_markers(tmp_path: Path) -> None:
    pkg_info = (
        "Metadata-Version: 2.1\nName: p\nVersion: 1\n"
        "Requires-Dist: six>=1.0\n"
        'Requires-Dist: tomli; python_version < "3.11"\n'
        'Requires-Dist: pytest; extra == "test"\n\nbody\n'
    )
    root = _write(tmp_path, {"PKG-INFO": pkg_info})
    assert read_requirements(root) == ["six>=1.0", 'tomli; python_version < "3.11"']


def test_requirements_fall_back_to_egg_info(tmp_path: Path) -> None:
    root = _write(tmp_path, {"PKG-INFO": "Name: p\n", "p.egg-info/requires.txt": "six\n\n[test]\npytest\n"})
    assert read_requirements(root) == ["six"]


def test_snapshot_keeps_text_and_skips_binary_caches_and_large_files(tmp_path: Path) -> None:
    root = _write(tmp_path, {"lib/a.py": "x = 1\n", "setup.cfg": "[x]\n", "lib/__pycache__/a.py": "junk"})
    (root / "lib" / "blob.bin").write_bytes(b"\x00\x01")
    (root / "lib" / "big.txt").write_text("y" * 300_000)
    assert snapshot_files(root) == {"lib/a.py": "x = 1\n", "setup.cfg": "[x]\n"}
    with pytest.raises(SdistError, match="too large"):
        snapshot_files(root, max_total_bytes=5)


def _run(outcomes: dict[str, Outcome], **kw: object) -> PytestRun:
    return PytestRun(outcomes=outcomes, **kw)  # type: ignore[arg-type]


P, F, E, S = Outcome.PASSED, Outcome.FAILED, Outcome.ERROR, Outcome.SKIPPED


def test_stable_passing_drops_flaky_tests_and_functions_with_unstable_ids() -> None:
    first = _run({"t.py::a": P, "t.py::flaky": P, "t.py::p[x0]": P, "t.py::p[y1]": P, "t.py::q[0]": P})
    second = _run({"t.py::a": P, "t.py::flaky": F, "t.py::p[x1]": P, "t.py::p[y0]": P, "t.py::q[0]": P})
    assert stable_passing([first, second]) == {"t.py::a", "t.py::q[0]"}


def test_classify_splits_failing_and_still_passing_tests() -> None:
    stable = {"a", "b", "c", "d"}
    assert classify(stable, _run({"a": F, "b": P, "c": E, "d": S, "new": F})) == (["a", "c"], ["b"])


def test_classify_refuses_broken_runs() -> None:
    stable = {"a", "b"}
    assert classify(stable, _run({"a": F})) is None  # b went missing
    assert classify(stable, _run({"a": F, "b": P}, collection_errors=["t.py"])) is None
    assert classify(stable, _run({"a": F, "b": P}, timed_out=True)) is None


def test_problem_statement_names_failures_but_not_the_fix() -> None:
    failing = [f"t.py::test_{i}" for i in range(7)]
    text = problem_statement(
        "lib==1.0", "python -m pytest", failing, {"t.py::test_0": "AssertionError: 1 != 2\nmore"}
    )
    assert "`t.py::test_0`" in text
    assert "AssertionError: 1 != 2" in text
    assert "more" not in text.split("AssertionError: 1 != 2")[1].split("\n")[0]
    assert "... and 2 more" in text
    assert "diff" not in text
