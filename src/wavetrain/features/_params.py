"""Feature configs: frozen dataclasses whose fields are declared parameters.

A config is a frozen dataclass whose fields are declared with :func:`param`, each a
:class:`wavetrain.core.params.Param` (the parameter system the model families use too). The
:class:`Config` base converts and checks every field on construction (``40`` becomes ``40.0``
for a float parameter, ``'HANN'`` becomes ``'hann'``), so equal settings give equal, equally
printed, equally hashed configs. Failures raise :class:`~wavetrain.core.errors.ParameterError` in the
one message form ``logmel.bands: expected an integer >= 1, got 0``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cache
from typing import Any, ClassVar

from wavetrain.core.params import Param, format_value

__all__ = ["Config", "format_value", "param", "param_specs"]


def param(default: Any, doc: str, *, kind: type, choices: tuple[str, ...] | None = None,
          low: float | None = None, high: float | None = None, low_open: bool = False,
          optional: bool = False) -> Any:
    """Declare one config field as a :class:`~wavetrain.core.params.Param` (its name is the field's).

    Parameters
    ----------
    default : object
        Default value (already of the declared kind, or ``None`` when ``optional``).
    doc : str
        One-line description with unit.
    kind : {int, float, bool, str}
        Value type.
    choices, low, high, low_open, optional
        As for :class:`~wavetrain.core.params.Param`.
    """
    spec = dict(default=default, doc=doc, type=kind, choices=choices, low=low, high=high,
                low_open=low_open, optional=optional)
    return field(default=default, metadata={"param": spec})


# Callers pass the class typed as plain ``type``: mypy checks a ``type[Config]`` argument against
# ``Hashable`` (for the cache) with the instances' ``__hash__``, which frozen dataclasses define,
# and rejects it, although every class object is hashable.
@cache
def _params(config_type: type) -> dict[str, Param]:
    """The declared parameters of a config type, by field name."""
    return {f.name: Param(f.name, **f.metadata["param"]) for f in dataclasses.fields(config_type)}


@dataclass(frozen=True)
class Config:
    """Base of every extractor/processor config (frozen, hashable, validated).

    Subclasses declare fields with :func:`param` and may override :meth:`_check` for
    cross-field rules (it may normalise fields with ``object.__setattr__``).
    """

    stage: ClassVar[str] = "config"
    #: Field names printed last (common framing parameters), in this order.
    trailing: ClassVar[tuple[str, ...]] = ()
    #: Field names printed only when not at their default: parameters added after feature stores
    #: were keyed by the printed spec, so that specs without them keep their keys.
    quiet_defaults: ClassVar[tuple[str, ...]] = ()
    #: Inherited parameters this stage does not take: refused (by its ``_check``) unless at their
    #: default, never printed at it, and not listed.
    hidden: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        cls: type = type(self)  # plain `type`: mypy takes type[Config] for unhashable (see _params)
        for name, p in _params(cls).items():
            object.__setattr__(self, name, p.coerce(getattr(self, name), self.stage))
        self._check()

    def _check(self) -> None:
        """Cross-field checks; raise ParameterError."""

    @classmethod
    def field_order(cls) -> list[str]:
        names = [f.name for f in dataclasses.fields(cls)]
        return [n for n in names if n not in cls.trailing] + [n for n in cls.trailing if n in names]

    def __str__(self) -> str:
        cls: type = type(self)  # plain `type`: see _params
        params = _params(cls)
        args = ", ".join(f"{n}={format_value(getattr(self, n))}" for n in self.field_order()
                         if n not in (*self.quiet_defaults, *self.hidden) or getattr(self, n) != params[n].default)
        return f"{self.stage}({args})"


def param_specs(config_type: type[Config]) -> list[dict]:
    """Parameters of a config type as ``[{name, default, doc}]`` in canonical order."""
    cls: type = config_type  # plain `type`: mypy takes type[Config] for unhashable (see _params)
    params = _params(cls)
    return [{"name": name, "default": params[name].default,
             "doc": f"{params[name].doc} ({params[name].allowed()})"} for name in config_type.field_order()
            if name not in config_type.hidden]
