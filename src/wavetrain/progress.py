"""Progress bars (tqdm on stderr), off when not a terminal unless forced."""
from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")


def progress_enabled(flag: bool | None = None) -> bool:
    if os.environ.get("WAVETRAIN_PROGRESS") == "0":
        return False
    if flag is not None:
        return flag and sys.stderr.isatty() or os.environ.get("WAVETRAIN_PROGRESS") == "1"
    return sys.stderr.isatty()


def progress_bar(it: Iterable[T] | None, *, desc: str = "", total: int | None = None, unit: str = "it",
                 enable: bool | None = None, **kw) -> Iterable[T]:
    """Wrap ``it`` in a tqdm bar when progress is enabled; otherwise return ``it``.

    With ``it=None`` returns a manual bar (``update``/``close``) or ``None`` when disabled."""
    if not progress_enabled(enable):
        return it
    from tqdm import tqdm

    return tqdm(it, desc=desc, total=total, unit=unit, leave=False, dynamic_ncols=True, file=sys.stderr, **kw)
