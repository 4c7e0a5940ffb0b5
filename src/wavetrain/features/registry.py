"""Registries of extractors and processors by name.

``@register_extractor`` / ``@register_processor`` key a class (with ``name`` and
``config_type``) by its name; the spec parser and :func:`describe_specs` read them.
"""
from __future__ import annotations

from wavetrain.features._params import param_specs

__all__ = ["EXTRACTORS", "PROCESSORS", "register_extractor", "register_processor",
           "describe_specs"]

EXTRACTORS: dict[str, type] = {}
PROCESSORS: dict[str, type] = {}


def register_extractor(cls: type) -> type:
    """Class decorator: register an extractor class under ``cls.name``."""
    cls.config_type.stage = cls.name
    EXTRACTORS[cls.name] = cls
    return cls


def register_processor(cls: type) -> type:
    """Class decorator: register a processor class under ``cls.name``."""
    cls.config_type.stage = cls.name
    PROCESSORS[cls.name] = cls
    return cls


def _ensure_loaded() -> None:
    # Importing the modules runs their registrations.
    from wavetrain.features import extractors, processors, stats  # noqa: F401


def describe_specs() -> list[dict]:
    """Every registered extractor and processor with its parameters.

    Returns
    -------
    list of dict
        One dict per stage: ``name`` (str), ``kind`` (``'extractor'`` or ``'processor'``),
        ``doc`` (one line) and ``params`` (list of ``{name, default, doc}`` in canonical order).
    """
    _ensure_loaded()
    out = []
    for kind, reg in (("extractor", EXTRACTORS), ("processor", PROCESSORS)):
        for name, cls in reg.items():
            doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
            out.append({"name": name, "kind": kind, "doc": doc,
                        "params": param_specs(cls.config_type)})
    return out
