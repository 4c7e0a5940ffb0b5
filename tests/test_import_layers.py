"""Imports flow one way: each module imports only from its own layer or the layers below it.

    cli → sound → spark, serve, sklearn → pipeline (jobs, memory planner, predictions)
        → stream (source, scheduler, feature stream) → models → train
        → features, store, data, evaluation, stream.windows, stream.batches → core

Outside ``cli/`` (whose commands defer the pipeline so that ``--help`` stays fast), an import
inside a function is allowed only where it defers a heavy library (torch, matplotlib).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "wavetrain"

#: Top to bottom; a module's layer is that of its longest matching prefix.
LAYERS: list[tuple[str, ...]] = [
    ("wavetrain.cli",),
    ("wavetrain.sound",),
    ("wavetrain.spark", "wavetrain.serve", "wavetrain.sklearn"),
    ("wavetrain.pipeline",),
    ("wavetrain.stream",),
    ("wavetrain.models",),
    ("wavetrain.train",),
    ("wavetrain.features", "wavetrain.store", "wavetrain.data", "wavetrain.evaluation", "wavetrain.stream.windows",
     "wavetrain.stream.batches"),
    ("wavetrain.core", "wavetrain"),
]
#: Modules that may be imported inside a function outside cli/: the torch feature path, imported
#: only when a torch device is asked for.
DEFERRED = {"wavetrain.features.torch_backend"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int:
    best, layer = -1, None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, layer = len(p), i
    assert layer is not None, f"{module} is in no layer: add it to LAYERS"
    return layer


def _imports(path: Path):
    """``(imported module, line, inside a function)`` of every wavetrain import of a file."""
    tree = ast.parse(path.read_text())
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rsplit(".", 1)[0]
    in_function = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f)}
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:                       # relative: resolved against this package
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names if _is_module(f"{base}.{a.name}")]
        for name in names:
            if name == "wavetrain" or name.startswith("wavetrain."):
                yield name, node.lineno, id(node) in in_function


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (SRC.parent / rel).with_suffix(".py").exists() or (SRC.parent / rel / "__init__.py").exists()


FILES = sorted(SRC.rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_imports_flow_one_way(path):
    me = _module_name(path)
    mine = _layer(me)
    backward = [f"line {line}: {name}" for name, line, _ in _imports(path) if _layer(name) < mine]
    assert not backward, f"{me} (layer {mine}) imports from a layer above it: {backward}"


@pytest.mark.parametrize("path", [p for p in FILES if "cli" not in p.relative_to(SRC).parts],
                         ids=lambda p: str(p.relative_to(SRC)))
def test_function_level_imports_only_defer_heavy_libraries(path):
    inside = [f"line {line}: {name}" for name, line, nested in _imports(path) if nested and name not in DEFERRED]
    assert not inside, f"{_module_name(path)} imports inside functions (move to the top): {inside}"


def test_a_backward_import_is_caught(tmp_path):
    """The check itself: a store module importing the stream is reported."""
    assert _layer("wavetrain.store.feature_store") > _layer("wavetrain.stream.feature_stream")
    assert _layer("wavetrain.models.gmm") < _layer("wavetrain.train.trainer")


def test_no_module_lies_loose_at_the_package_root():
    """Every module sits in a package that names its layer."""
    assert sorted(p.name for p in SRC.glob("*.py")) == ["__init__.py"]
