"""Registries of extractors and processors by name.

``@register_extractor`` / ``@register_processor`` key a class (with ``name`` and
``config_type``) by its name; the spec parser (:mod:`wavetrain.features.spec`, which imports every
extractor and processor module so that they are registered) reads them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from wavetrain.features.base import Extractor
    from wavetrain.features.processors import Processor

__all__ = ["EXTRACTORS", "PROCESSORS", "register_extractor", "register_processor"]

EXTRACTORS: dict[str, type[Extractor]] = {}
PROCESSORS: dict[str, type[Processor]] = {}

_E = TypeVar("_E", bound="type[Extractor]")
_P = TypeVar("_P", bound="type[Processor]")


def register_extractor(cls: _E) -> _E:
    """Class decorator: register an extractor class under ``cls.name``."""
    cls.config_type.stage = cls.name
    EXTRACTORS[cls.name] = cls
    return cls


def register_processor(cls: _P) -> _P:
    """Class decorator: register a processor class under ``cls.name``."""
    cls.config_type.stage = cls.name
    PROCESSORS[cls.name] = cls
    return cls
