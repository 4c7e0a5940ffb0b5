"""Hyper-parameters declared as data: name, type, default, limits and meaning.

Every model declares a table of :class:`Param`; values are checked when the model is built,
with one message form: ``model.param: expected <what is allowed>, got <value>``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wavetrain.errors import ParameterError


@dataclass(frozen=True)
class Param:
    """One hyper-parameter.

    Attributes
    ----------
    name : str
    default : object
    doc : str
        One line: what it means, with its unit.
    type : type
        ``int``, ``float``, ``str`` or ``bool``. ``None`` is allowed when ``optional``.
    low, high : float or None
        Inclusive limits for numbers.
    choices : tuple of str or None
        Allowed values for strings.
    optional : bool
        Whether ``None`` (written ``none`` on the command line) is allowed.
    """

    name: str
    default: Any
    doc: str
    type: type = str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] | None = None
    optional: bool = False

    def allowed(self) -> str:
        if self.choices:
            s = "one of " + ", ".join(self.choices)
        elif self.type in (int, float):
            kind = "an integer" if self.type is int else "a number"
            if self.low is not None and self.high is not None:
                s = f"{kind} in [{self.low}, {self.high}]"
            elif self.low is not None:
                s = f"{kind} >= {self.low}"
            elif self.high is not None:
                s = f"{kind} <= {self.high}"
            else:
                s = kind
        elif self.type is bool:
            s = "true or false"
        else:
            s = "a string"
        return s + (" or none" if self.optional else "")

    def coerce(self, value: Any, owner: str) -> Any:
        """Convert ``value`` (possibly a command-line string) and check it against the limits."""
        where = f"{owner}.{self.name}"
        is_none_word = isinstance(value, str) and value.strip().lower() in ("none", "null")
        if value is None or (is_none_word and not (self.choices and value.strip().lower() in self.choices)):
            if self.optional:
                return None
            raise ParameterError(f"{where}: expected {self.allowed()}, got none")
        try:
            if self.type is bool:
                if isinstance(value, str):
                    v = value.strip().lower()
                    if v not in ("true", "false", "1", "0", "yes", "no"):
                        raise ValueError
                    value = v in ("true", "1", "yes")
                elif not isinstance(value, (bool, int)):
                    raise ValueError
                value = bool(value)
            elif self.type is int:
                if isinstance(value, float) and not value.is_integer():
                    raise ValueError
                if isinstance(value, bool):
                    raise ValueError
                value = int(str(value).strip()) if isinstance(value, str) else int(value)
            elif self.type is float:
                if isinstance(value, bool):
                    raise ValueError
                value = float(value)
                if value != value:
                    raise ValueError
            else:
                value = str(value).strip()
        except (TypeError, ValueError):
            raise ParameterError(f"{where}: expected {self.allowed()}, got {value!r}") from None
        if self.choices and value not in self.choices:
            raise ParameterError(f"{where}: expected {self.allowed()}, got {value!r}")
        if self.type in (int, float):
            if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
                raise ParameterError(f"{where}: expected {self.allowed()}, got {value!r}")
        return value


def validate_params(table: tuple[Param, ...], given: dict[str, Any], owner: str) -> dict[str, Any]:
    """Fill defaults and check ``given`` against ``table``; unknown names are an error."""
    by_name = {p.name: p for p in table}
    unknown = [k for k in given if k not in by_name]
    if unknown:
        raise ParameterError(f"{owner}: unknown parameter {unknown[0]!r}; expected one of: "
                             f"{', '.join(by_name)} (see `wavetrain models`)")
    out = {}
    for p in table:
        out[p.name] = p.coerce(given[p.name], owner) if p.name in given else p.default
    return out
