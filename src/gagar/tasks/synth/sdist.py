"""A PyPI source distribution: download, safe unpacking, layout, runtime requirements, snapshot."""

from __future__ import annotations

import email.parser
import re
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

__all__ = [
    "Layout",
    "SdistError",
    "detect_layout",
    "download_sdist",
    "parse_spec",
    "read_requirements",
    "safe_extract",
    "snapshot_files",
]

_SPEC_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.!+_-]*)$")
_SKIP_DIRS = {
    "__pycache__",
    ".git",
    ".github",
    ".hg",
    ".tox",
    ".nox",
    "build",
    "dist",
    ".eggs",
    "docs",
    "doc",
}
_CONFIG_FILES = ("setup.cfg", "pyproject.toml", "pytest.ini", "tox.ini", "conftest.py")


class SdistError(RuntimeError):
    """A source distribution that cannot be fetched, unpacked or understood."""


def parse_spec(spec: str) -> tuple[str, str]:
    """``"NAME==VERSION"`` -> ``(NAME, VERSION)``; only exact pins are accepted."""
    match = _SPEC_RE.match(spec.strip())
    if match is None:
        raise ValueError(f"expected an exact pin NAME==VERSION, got {spec!r}")
    return match.group(1), match.group(2)


def download_sdist(name: str, version: str, dest: Path, timeout_s: float = 300.0) -> Path:
    """Download the sdist of ``name==version`` into ``dest`` (kept if already there); returns the archive."""
    dest.mkdir(parents=True, exist_ok=True)
    found = _archives(dest)
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        cmd += ["--disable-pip-version-check", "-q", "-d", str(dest), f"{name}=={version}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        found = _archives(dest)
        if proc.returncode != 0 or not found:
            raise SdistError(f"pip download {name}=={version} failed:\n{(proc.stdout + proc.stderr)[-2000:]}")
    if len(found) != 1:
        raise SdistError(f"expected one sdist archive in {dest}, found {[p.name for p in found]}")
    return found[0]


def _archives(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.endswith((".tar.gz", ".tgz", ".tar.bz2", ".zip")))


def _check_member(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise SdistError(f"archive member {name!r} would leave the extraction directory")
    return path


def safe_extract(archive: Path, dest: Path) -> Path:
    """Unpack ``archive`` into ``dest`` and return its single top-level directory.

    Refuses members with absolute paths or ``..``, and links or device files anywhere.
    """
    dest.mkdir(parents=True, exist_ok=True)
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                _check_member(info.filename)
                if (info.external_attr >> 16) & 0o170000 == 0o120000:
                    raise SdistError(f"archive member {info.filename!r} is a symbolic link")
            zf.extractall(dest)
    else:
        with tarfile.open(archive) as tf:
            members = tf.getmembers()
            for member in members:
                _check_member(member.name)
                if not (member.isfile() or member.isdir()):
                    raise SdistError(f"archive member {member.name!r} is not a regular file or directory")
            tf.extractall(dest, members=members, filter="data")
    tops = {PurePosixPath(p.name).parts[0] for p in dest.iterdir()}
    if len(tops) != 1 or not (dest / next(iter(tops))).is_dir():
        raise SdistError(f"{archive.name} does not unpack into a single directory")
    return dest / next(iter(tops))


@dataclass(frozen=True)
class Layout:
    """Where a project's code and tests live, relative to its root (POSIX paths)."""

    source_root: str
    """Directory on ``sys.path`` for the package: ``"src"`` for a src layout, else ``"."``."""
    package_files: tuple[str, ...]
    """Python files of the library itself (mutation targets)."""
    test_targets: tuple[str, ...]
    """What to hand to pytest: test directories, or test files at the root."""


def _is_test_file(path: PurePosixPath) -> bool:
    return path.suffix == ".py" and (path.name.startswith("test_") or path.stem.endswith("_test"))


def _python_files(root: Path) -> list[PurePosixPath]:
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = PurePosixPath(path.relative_to(root).as_posix())
        if not (set(rel.parts[:-1]) & _SKIP_DIRS or rel.parts[0].endswith(".egg-info")):
            files.append(rel)
    return files


def detect_layout(root: Path) -> Layout:
    """Find the package sources and the tests of an unpacked sdist.

    Raises:
        SdistError: if it holds no test files or no library code.
    """
    files = _python_files(root)
    tests = [f for f in files if _is_test_file(f)]
    if not tests:
        raise SdistError(f"{root.name} ships no test files (test_*.py or *_test.py)")
    here = PurePosixPath(".")
    test_dirs = {f.parent for f in tests if f.parent != here}
    # outermost test directories (a package's own toolz/tests stays toolz/tests), then root-level test files
    targets = sorted(str(d) for d in test_dirs if not any(o in d.parents for o in test_dirs))
    targets += sorted(str(f) for f in tests if f.parent == here)
    source_root = "src" if (root / "src").is_dir() and any(f.parts[0] == "src" for f in files) else "."
    in_tests = {PurePosixPath(t) for t in targets}
    package = [
        str(f)
        for f in files
        if f not in in_tests
        and not any(t in f.parents for t in in_tests)
        and f.name not in ("setup.py", "conftest.py", "noxfile.py", "fabfile.py")
        and (source_root == "." or f.parts[0] == "src")
    ]
    if not package:
        raise SdistError(f"{root.name} has no library code outside its tests")
    return Layout(source_root, tuple(package), tuple(targets))


def read_requirements(root: Path) -> list[str]:
    """Runtime requirements from the sdist metadata (``PKG-INFO``, else ``*.egg-info/requires.txt``).

    Requirements that only apply to an extra are left out; environment markers are kept for pip.
    """
    pkg_info = root / "PKG-INFO"
    reqs: list[str] = []
    if pkg_info.is_file():
        meta = email.parser.Parser().parsestr(pkg_info.read_text(encoding="utf-8", errors="replace"))
        reqs = [r.strip() for r in meta.get_all("Requires-Dist") or [] if "extra" not in r.partition(";")[2]]
    if reqs:
        return reqs
    for requires in sorted(root.glob("*.egg-info/requires.txt")) + sorted(
        root.glob("src/*.egg-info/requires.txt")
    ):
        for line in requires.read_text(encoding="utf-8").splitlines():
            if line.startswith("["):
                break  # extras sections follow the unconditional requirements
            if line.strip():
                reqs.append(line.strip())
    return reqs


def snapshot_files(
    root: Path, max_file_bytes: int = 256_000, max_total_bytes: int = 4_000_000
) -> dict[str, str]:
    """The text files a test run needs: every Python file outside build/doc folders, config files,
    and small text data files next to the code; path -> text.

    Raises:
        SdistError: if the snapshot would exceed ``max_total_bytes``.
    """
    snapshot: dict[str, str] = {}
    total = 0
    for path in sorted(root.rglob("*")):
        rel = PurePosixPath(path.relative_to(root).as_posix())
        if not path.is_file() or set(rel.parts[:-1]) & _SKIP_DIRS or rel.parts[0].endswith(".egg-info"):
            continue
        if rel.name == "PKG-INFO" or path.suffix in (".pyc", ".pyo") or path.stat().st_size > max_file_bytes:
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        total += len(data)
        if total > max_total_bytes:
            raise SdistError(f"{root.name}: text files exceed {max_total_bytes} bytes; too large to bundle")
        snapshot[str(rel)] = text
    missing = [name for name in _CONFIG_FILES if (root / name).is_file() and name not in snapshot]
    if missing:
        raise SdistError(f"{root.name}: config files {missing} could not be bundled")
    return snapshot
