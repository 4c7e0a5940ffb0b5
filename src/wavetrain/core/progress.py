"""Progress bars (tqdm on stderr), off when not a terminal unless forced."""
from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any, TypeVar

T = TypeVar("T")


def progress_enabled(flag: bool | None = None) -> bool:
    """Bars on? ``WAVETRAIN_PROGRESS=0`` turns them off whatever else is said; then ``flag``
    (``--progress`` / ``--no-progress``: True shows them also when stderr is a file or a pipe);
    without one, ``WAVETRAIN_PROGRESS=1`` or a terminal on stderr turns them on."""
    if os.environ.get("WAVETRAIN_PROGRESS") == "0":
        return False
    if flag is not None:
        return flag
    return os.environ.get("WAVETRAIN_PROGRESS") == "1" or sys.stderr.isatty()


def _tqdm(it: Iterable[Any] | None, desc: str, total: int | None, unit: str, **kw: Any) -> Any:
    from tqdm import tqdm

    return tqdm(it, desc=desc, total=total, unit=unit, leave=False, dynamic_ncols=True, file=sys.stderr, **kw)


def progress_bar(it: Iterable[T], *, desc: str = "", total: int | None = None, unit: str = "it",
                 enable: bool | None = None, **kw: Any) -> Iterable[T]:
    """Wrap ``it`` in a tqdm bar when progress is enabled; otherwise return ``it``."""
    return _tqdm(it, desc, total, unit, **kw) if progress_enabled(enable) else it


def progress_counter(*, desc: str = "", total: int | None = None, unit: str = "it",
                     enable: bool | None = None, initial: int = 0) -> Any | None:
    """A bar advanced by hand (``update(n)``, ``set_postfix``, ``close``) from ``initial`` when
    progress is enabled, else None."""
    return _tqdm(None, desc, total, unit, initial=initial) if progress_enabled(enable) else None
