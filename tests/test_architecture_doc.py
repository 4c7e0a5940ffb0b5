"""docs/architecture.md is the map of the code: every package and module under src/wavetrain is
named in it, nothing else is, and the packages come in the order of the import layers
(tests/test_import_layers.py), so the map cannot drift from the tree."""
from __future__ import annotations

import re

from tests.test_import_layers import LAYERS, SRC

DOC = SRC.parents[1] / "docs" / "architecture.md"


def _entries() -> dict[str, set[str]]:
    """The map's code block: each package (``name/`` at the start of a line) and the ``*.py``
    modules named in its entry, in the order they come."""
    block = DOC.read_text(encoding="utf-8").split("```")[1]
    entries: dict[str, set[str]] = {}
    package = None
    for line in block.splitlines():
        m = re.match(r"([a-z_]+)/\s", line)
        if m:
            package = m.group(1)
            entries[package] = set()
        if package is not None:
            entries[package] |= set(re.findall(r"\b([A-Za-z_]\w*\.py)\b", line))
    return entries


def test_every_package_and_module_is_on_the_map():
    entries = _entries()
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert set(entries) == packages, "packages missing from / unknown to docs/architecture.md"
    for package, named in entries.items():
        modules = {p.name for p in (SRC / package).glob("*.py") if p.name != "__init__.py"}
        assert named == modules, (f"{package}/: missing from the map {sorted(modules - named)}, "
                                  f"on the map but not in the tree {sorted(named - modules)}")


def test_the_map_follows_the_import_layers():
    layer = {name.split(".")[1]: i for i, names in enumerate(LAYERS) for name in names if name.count(".") == 1}
    order = [layer[p] for p in _entries()]
    assert order == sorted(order), "docs/architecture.md lists the packages out of their layers' order"
