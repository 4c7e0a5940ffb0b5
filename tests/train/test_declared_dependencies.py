"""Every third-party module the package imports is declared in pyproject.toml (a dependency or
an extra) and pinned in the requirements files `make setup` installs."""
import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Import names whose distribution is named otherwise.
DISTRIBUTION = {"python_multipart": "python-multipart", "sklearn": "scikit-learn"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _imported() -> dict[str, str]:
    """Third-party top-level modules imported anywhere in src/wavetrain -> a file importing it."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "src" / "wavetrain").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "wavetrain":
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def _requirement_names(lines) -> set[str]:
    return {_norm(re.split(r"[\s<>=!~;\[]", line.strip(), maxsplit=1)[0]) for line in lines
            if line.strip() and not line.strip().startswith(("#", "-"))}


def test_every_imported_module_is_declared_and_pinned():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = _requirement_names(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        declared |= _requirement_names(extra)
    pinned = set()
    for req in sorted(ROOT.glob("requirements*.txt")):      # the core's, each extra's and the development tools'
        pinned |= _requirement_names(req.read_text(encoding="utf-8").splitlines())
    imported = _imported()
    assert "threadpoolctl" in imported and "numpy" in imported        # the scan sees the imports
    for module, where in imported.items():
        dist = _norm(DISTRIBUTION.get(module, module))
        assert dist in declared, f"{module} (imported in {where}) is not declared in pyproject.toml"
        assert dist in pinned, f"{module} (imported in {where}) is not pinned in requirements*.txt"


def test_threadpoolctl_is_a_runtime_dependency_not_an_extra():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    assert "threadpoolctl" in _requirement_names(deps)
    assert "threadpoolctl" in _requirement_names((ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines())
