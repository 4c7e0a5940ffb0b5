"""Declared parameters for feature configs: typed, bounded, documented.

A config is a frozen dataclass whose fields are declared with :func:`param`.  The
:class:`Config` base coerces and checks every field on construction (``40`` becomes
``40.0`` for a float parameter, ``'HANN'`` becomes ``'hann'``), so equal settings give equal,
equally printed, equally hashed configs.  Failures raise :class:`~wavetrain.errors.ParameterError`
naming the stage, the parameter, what is allowed and what was given.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from wavetrain.errors import ParameterError

__all__ = ["Config", "param", "format_value", "param_specs"]


def param(default: Any, doc: str, *, kind: type, choices: tuple[str, ...] | None = None,
          low: float | None = None, high: float | None = None, low_open: bool = False,
          optional: bool = False) -> Any:
    """Declare one config parameter.

    Parameters
    ----------
    default : object
        Default value (already of the declared kind, or ``None`` when ``optional``).
    doc : str
        One-line description with unit.
    kind : {int, float, bool, str}
        Value type; ints are accepted for floats, integral floats for ints.
    choices : tuple of str, optional
        Allowed values of a ``str`` parameter (compared case-insensitively); for an ``int``
        parameter, keywords accepted besides integers (e.g. ``n_fft=fast``).
    low, high : float, optional
        Inclusive bounds (``low`` exclusive when ``low_open``).
    optional : bool, default=False
        Whether ``None`` (written ``none``) is allowed.
    """
    meta = dict(doc=doc, kind=kind, choices=choices, low=low, high=high, low_open=low_open,
                optional=optional)
    return field(default=default, metadata=meta)


def _describe(meta: dict) -> str:
    kind = meta["kind"]
    if meta["choices"] and kind is not str:
        low = "" if meta["low"] is None else " >= " + format_value(meta["low"])
        text = f"an integer{low} or one of " + "|".join(meta["choices"])
    elif meta["choices"]:
        text = "one of " + "|".join(meta["choices"])
    elif kind is bool:
        text = "true or false"
    else:
        text = "an integer" if kind is int else "a number"
        if meta["low"] is not None:
            text += (" > " if meta["low_open"] else " >= ") + format_value(meta["low"])
        if meta["high"] is not None:
            text += (" and" if meta["low"] is not None else "") + " <= " + format_value(meta["high"])
    if meta["optional"]:
        text += " or none"
    return text


def _coerce(owner: str, name: str, value: Any, meta: dict) -> Any:
    def bad() -> ParameterError:
        return ParameterError(f"{owner} parameter {name}={format_value(value)} is invalid: "
                              f"expected {_describe(meta)}")

    if value is None and meta["kind"] is str and "none" in (meta["choices"] or ()):
        value = "none"
    if value is None:
        if meta["optional"]:
            return None
        raise bad()
    kind = meta["kind"]
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, float)) and value in (0, 1):
            return bool(value)
        raise bad()
    if kind is str:
        if not isinstance(value, str):
            raise bad()
        value = value.lower()
        if meta["choices"] and value not in meta["choices"]:
            raise bad()
        return value
    if isinstance(value, str) and meta["choices"] and value.lower() in meta["choices"]:
        return value.lower()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad()
    if not math.isfinite(value):
        raise bad()
    if kind is int:
        if float(value) != int(value):
            raise bad()
        value = int(value)
    else:
        value = float(value)
    low, high = meta["low"], meta["high"]
    if low is not None and (value <= low if meta["low_open"] else value < low):
        raise bad()
    if high is not None and value > high:
        raise bad()
    return value


def format_value(value: Any) -> str:
    """Canonical text of a parameter value (``true``, ``none``, ``40``, ``12.5``, ``hann``)."""
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
class Config:
    """Base of every extractor/processor config (frozen, hashable, validated).

    Subclasses declare fields with :func:`param` and may override :meth:`_check` for
    cross-field rules (it may normalise fields with ``object.__setattr__``).
    """

    stage: ClassVar[str] = "config"
    #: Field names printed last (common framing parameters), in this order.
    trailing: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = _coerce(self.stage, f.name, getattr(self, f.name), f.metadata)
            object.__setattr__(self, f.name, value)
        self._check()

    def _check(self) -> None:
        """Cross-field checks; raise ParameterError."""

    @classmethod
    def field_order(cls) -> list[str]:
        names = [f.name for f in dataclasses.fields(cls)]
        return [n for n in names if n not in cls.trailing] + [n for n in cls.trailing if n in names]

    def __str__(self) -> str:
        args = ", ".join(f"{n}={format_value(getattr(self, n))}" for n in self.field_order())
        return f"{self.stage}({args})"


def param_specs(config_type: type[Config]) -> list[dict]:
    """Parameters of a config type as ``[{name, default, doc}]`` in canonical order."""
    fields = {f.name: f for f in dataclasses.fields(config_type)}
    out = []
    for name in config_type.field_order():
        f = fields[name]
        out.append({"name": name, "default": f.default,
                    "doc": f"{f.metadata['doc']} ({_describe(f.metadata)})"})
    return out
