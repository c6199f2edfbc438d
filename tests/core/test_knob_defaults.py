"""Every tuning knob has one declaration of its default.

Read from the source, so a copied default is caught however it is spelled: ``x: float = 1.0``,
``Field(default=1.0, ...)``, ``Field(1.0, ...)``, ``-1.0``, in a pydantic model, a dataclass or a
function signature.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import gagar
from gagar.experiment.config import EvalSettings
from gagar.schema.trajectory import SamplingParams
from gagar.train.config import RolloutSettings

SRC = Path(gagar.__file__).resolve().parent

SAMPLING_KNOBS = ("temperature", "top_p", "max_new_tokens")
"""Declared once, as ``Temperature``, ``TopP`` and ``MaxNewTokens`` in :mod:`gagar.schema.trajectory`."""

OVERRIDES = {("experiment/config.py", "EvalSettings", "max_new_tokens")}
"""Fields that deliberately give a sampling knob another value, with a comment saying why."""

DISTINCT = {
    # different knobs that share a name: each is declared once, for its own stage or component
    "lr", "weight_decay", "steps", "keep_checkpoints", "seed", "max_concurrency", "timeout_s", "group_size",
    # record fields (what a record holds when a producer leaves it out), not tuning knobs
    "duration_s", "edits_reverted", "model_patch", "requests", "tests_run", "turns",
}  # fmt: skip
"""Field names with a literal default in several classes that are not one knob declared twice."""

KNOWN_REPEATS = {
    "gamma", "floor",  # AdvantageConfig (advantage.py) and AdvantageSettings (train/config.py)
    "epochs",  # ScorerConfig (grader/learned.py) and the experiment's GraderSFTSettings
    "base_delay_s", "max_delay_s",  # the two RetryPolicy classes (sandbox/k8s/config.py, storage/retry.py)
    "image_repo_dir",  # KubernetesSandboxConfig and ImageSettings
    "nodes", "procs_per_node",  # DistributedSettings and TrainJobSpec
}  # fmt: skip
"""One knob still declared in two classes: to be fixed, never added to."""


def _literal(node: ast.expr | None) -> object | None:
    """The literal a default is written as (unwrapping ``Field(...)``), or None for anything else."""
    if isinstance(node, ast.Constant) and not isinstance(node.value, bool | type(None)):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        return _literal(node.operand)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
        name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
        if name in ("Field", "field"):
            given = [k.value for k in node.keywords if k.arg == "default"] or node.args[:1]
            return _literal(given[0]) if given else None
    return None


def _unset(node: ast.expr) -> bool:
    """``None``, or a CLI option left unset (``typer.Option(None, ...)``): the settings supply the value."""
    if isinstance(node, ast.Call) and node.args:
        node = node.args[0]
    return isinstance(node, ast.Constant) and node.value is None


def _modules() -> list[tuple[str, ast.Module]]:
    return [(str(path.relative_to(SRC)), ast.parse(path.read_text())) for path in sorted(SRC.rglob("*.py"))]


def _class_defaults() -> dict[str, list[tuple[str, str]]]:
    """Field name -> the (module, class) pairs that give it a literal default."""
    found: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for module, tree in _modules():
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for stmt in cls.body:
                named = isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                if named and _literal(stmt.value) is not None:
                    found[stmt.target.id].append((module, cls.name))
    return found


def test_no_settings_class_declares_a_sampling_knobs_default_of_its_own():
    found = _class_defaults()
    copies = [
        f"{module}: {cls}.{name}"
        for name in SAMPLING_KNOBS
        for module, cls in found.get(name, [])
        if (module, cls, name) not in OVERRIDES
    ]
    assert not copies, f"type these with gagar.schema.trajectory's Temperature/TopP/MaxNewTokens: {copies}"


def test_no_function_gives_a_sampling_knob_a_default():
    """The algorithm (train/loss.py, policy/generation.py, ...) takes the knob from the settings; a CLI
    option may be unset (None), the settings then supply it."""
    defaulted = []
    for module, tree in _modules():
        for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
            args = fn.args
            positional = args.posonlyargs + args.args
            pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None]
            knobs = [a.arg for a, d in pairs if a.arg in SAMPLING_KNOBS and not _unset(d)]
            defaulted += [f"{module}: {fn.name}({knob}=...)" for knob in knobs]
    assert not defaulted, f"pass the settings' value instead of a default: {defaulted}"


def test_the_sampling_fields_share_one_declaration():
    """Same bounds and default in every model that offers a knob; an override changes the value only."""
    models = (SamplingParams, RolloutSettings, EvalSettings)
    for name in SAMPLING_KNOBS:
        declared = SamplingParams.model_fields[name]
        for model in models:
            field = model.model_fields[name]
            assert field.metadata == declared.metadata, (model.__name__, name)
            if ("experiment/config.py", model.__name__, name) in OVERRIDES:
                assert field.default != declared.default, f"{model.__name__}.{name} overrides nothing"
            else:
                assert field.default == declared.default, (model.__name__, name)


def test_a_knobs_literal_default_is_declared_in_one_class():
    repeated = {name: where for name, where in _class_defaults().items() if len(where) > 1}
    new = {name: where for name, where in repeated.items() if name not in DISTINCT | KNOWN_REPEATS}
    assert not new, f"declare each default once and reference it: {new}"
    stale = sorted((DISTINCT | KNOWN_REPEATS) - repeated.keys())
    assert not stale, f"no longer repeated: take {stale} off the lists"
