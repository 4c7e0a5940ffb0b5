"""The optional dependencies (the extras of ``pyproject.toml``) and the one-line refusal when one is missing.

``make setup`` installs the runtime core (the statistical families, features, plots, the demo);
each extra adds a capability: ``make setup-networks`` (or ``pip install 'wavetrain[networks]'``)
PyTorch, ``make setup-spark`` pyspark, and so on.  Code that needs one imports it through
:func:`import_extra` (or checks it with :func:`require`) at the point of use, never at module
import time, so that the core commands run without it; a missing one is a
:class:`MissingExtraError` (a :class:`~wavetrain.core.errors.UserError`: one line, exit code 2)
that names the extra and how to install it.
"""
from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from wavetrain.core.errors import UserError

__all__ = ["EXTRAS", "MissingExtraError", "has_module", "import_extra", "install_hint", "require"]

#: Top-level module -> (the extra that installs it, the name a user knows it by).
EXTRAS: dict[str, tuple[str, str]] = {
    "torch": ("networks", "PyTorch"),
    "pyspark": ("spark", "pyspark"),
    "py4j": ("spark", "py4j"),
    "pyarrow": ("spark", "pyarrow"),
    "onnx": ("export", "onnx"),
    "onnxruntime": ("export", "onnxruntime"),
    "starlette": ("serve", "Starlette"),
    "uvicorn": ("serve", "uvicorn"),
    "openwakeword": ("speech", "openwakeword"),
    "sklearn": ("sklearn", "scikit-learn"),
    "mkl_fft": ("fast-fft", "Intel MKL's FFT (mkl_fft)"),
}


class MissingExtraError(UserError):
    """A capability whose optional dependency is not installed (or does not import); ``extra``
    names the extra that installs it."""

    def __init__(self, message: str, *, extra: str | None = None, module: str | None = None):
        super().__init__(message)
        self.extra = extra
        self.module = module


def install_hint(extra: str) -> str:
    """How to install ``extra``: ``make setup-EXTRA`` in a checkout, or pip."""
    return f"install it with `make setup-{extra}` (or pip install 'wavetrain[{extra}]')"


def _top(module: str) -> str:
    return module.split(".", 1)[0]


def _refusal(module: str, who: str, problem: str | None = None) -> MissingExtraError:
    extra, name = EXTRAS[_top(module)]
    if problem is None:
        text = f"{who} needs {name}: {install_hint(extra)}"
    else:
        text = f"{who} needs {name}, which does not import here ({problem}): re{install_hint(extra)}"
    return MissingExtraError(text, extra=extra, module=_top(module))


def has_module(module: str) -> bool:
    """Whether ``module`` is installed (found without importing it)."""
    try:
        return importlib.util.find_spec(_top(module)) is not None
    except (ImportError, ValueError):   # blocked, or a module object without a spec
        return False


def require(module: str, who: str) -> None:
    """Refuse in one line (:class:`MissingExtraError`) when ``module`` is not installed; ``who``
    is what needs it (``"cnn"``, ``"--engine spark"``). Cheap: nothing is imported."""
    if not has_module(module):
        raise _refusal(module, who)


def import_extra(module: str, who: str) -> ModuleType:
    """``module`` imported, or a one-line :class:`MissingExtraError` naming its extra when it is
    missing (or fails to import: a broken install)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and _top(e.name) == _top(module):
            raise _refusal(module, who) from None
        raise _refusal(module, who, f"{e.name or e} is missing") from None
    except ImportError as e:
        raise _refusal(module, who, str(e).splitlines()[0] if str(e) else type(e).__name__) from None
