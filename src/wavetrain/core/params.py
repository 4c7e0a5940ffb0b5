"""Parameters declared as data: name, type, default, limits and meaning — one system for the
feature configs (``logmel(bands=64)``) and the model families (``--set components=16``).

A :class:`Param` converts a value given in any of the forms a user writes it — a Python value, a
spec token, a command-line string (``"16"``, ``"true"``, ``"none"``) — to its type and checks it
against its limits, with one message form::

    <owner>.<name>: expected <what is allowed>, got <value>

e.g. ``gmm.components: expected an integer in [1, 1024], got 0`` or ``logmel.bands: expected an
integer >= 1, got 0``. The error's ``param`` attribute names the parameter (the spec parser uses
it to point at its column).
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from wavetrain.core.errors import ParameterError

__all__ = ["Param", "format_value", "validate_params"]

_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")
_NONE_WORDS = ("none", "null")


def format_value(value: Any) -> str:
    """Canonical text of a value (``true``, ``none``, ``40``, ``12.5``, ``hann``)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return repr(value)
    return str(value)


@dataclass(frozen=True)
class Param:
    """One parameter.

    Attributes
    ----------
    name : str
    default : object
    doc : str
        One line: what it means, with its unit.
    type : {int, float, bool, str}
        Value type. Integral floats and numeric strings are accepted for numbers.
    low, high : float or None
        Inclusive limits of numbers (``low`` exclusive when ``low_open``).
    low_open : bool
    choices : tuple of str or None
        Allowed values of a string (matched case-insensitively, kept lower case); for an
        integer, keywords accepted besides integers (e.g. ``n_fft=fast``).
    optional : bool
        Whether ``None`` (written ``none``) is allowed.
    """

    name: str
    default: Any
    doc: str
    type: type = str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    choices: tuple[str, ...] | None = None
    optional: bool = False

    def allowed(self) -> str:
        """What is allowed, in words (``an integer in [1, 1024]``, ``one of hann, hamming``)."""
        if self.type is bool:
            text = "true or false"
        elif self.type is str:
            text = "one of " + ", ".join(self.choices) if self.choices else "a string"
        else:
            text = ("an integer" if self.type is int else "a number") + self._bounds()
            if self.choices:
                text += " or one of " + ", ".join(self.choices)
        return text + (" or none" if self.optional else "")

    def _bounds(self) -> str:
        lo = None if self.low is None else format_value(self.low)
        hi = None if self.high is None else format_value(self.high)
        if lo is not None and hi is not None:
            return f" in {'(' if self.low_open else '['}{lo}, {hi}]"
        if lo is not None:
            return f" {'>' if self.low_open else '>='} {lo}"
        return "" if hi is None else f" <= {hi}"

    def error(self, owner: str, value: Any) -> ParameterError:
        """The one message form: ``owner.name: expected <allowed>, got <value>``."""
        shown = repr(value) if isinstance(value, str) else format_value(value)
        return ParameterError(f"{owner}.{self.name}: expected {self.allowed()}, got {shown}", param=self.name)

    def coerce(self, value: Any, owner: str) -> Any:
        """``value`` converted to the parameter's type and checked; raises :class:`ParameterError`."""
        if isinstance(value, np.generic):       # numpy scalars count as the Python values they hold
            value = value.item()
        text = value.strip().lower() if isinstance(value, str) else None
        if value is None or text in _NONE_WORDS:
            if self.type is str and self.choices and "none" in self.choices:
                return "none"
            if self.optional:
                return None
            raise self.error(owner, value)
        try:
            out = self._convert(value, text)
        except (TypeError, ValueError, OverflowError):
            raise self.error(owner, value) from None
        if self.type in (int, float) and not isinstance(out, str) and not self._in_bounds(out):
            raise self.error(owner, out)
        return out

    def _convert(self, value: Any, text: str | None) -> Any:
        if self.type is bool:
            if isinstance(value, bool):
                return value
            if text is not None and text in _TRUE + _FALSE:
                return text in _TRUE
            if isinstance(value, (int, float)) and value in (0, 1):
                return bool(value)
            raise ValueError
        if self.type is str:
            if not isinstance(value, str):
                raise TypeError
            if self.choices:
                if text not in self.choices:
                    raise ValueError
                return text
            return value.strip()
        if text is not None and self.choices and text in self.choices:
            return text
        if isinstance(value, bool):
            raise TypeError
        number = float(text) if text is not None else value
        if not isinstance(number, (int, float)) or not math.isfinite(number):
            raise ValueError
        if self.type is int:
            if float(number) != int(number):
                raise ValueError
            return int(number) if text is None else int(float(text))
        return float(number)

    def _in_bounds(self, v: float) -> bool:
        if self.low is not None and (v <= self.low if self.low_open else v < self.low):
            return False
        return self.high is None or v <= self.high


def validate_params(table: Iterable[Param], given: dict[str, Any], owner: str) -> dict[str, Any]:
    """Fill defaults and check ``given`` against ``table``; an unknown name is an error."""
    by_name = {p.name: p for p in table}
    unknown = [k for k in given if k not in by_name]
    if unknown:
        raise ParameterError(f"{owner}: unknown parameter {unknown[0]!r}; expected one of: "
                             f"{', '.join(by_name)}", param=unknown[0])
    return {p.name: p.coerce(given[p.name], owner) if p.name in given else p.default for p in by_name.values()}
