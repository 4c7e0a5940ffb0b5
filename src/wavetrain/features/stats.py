"""Time-domain extractors: ``identity`` (raw samples), ``rms`` and ``stats``.

These use no analysis window; each sub-window is taken as is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from wavetrain.core.errors import ParameterError
from wavetrain.features.base import Extractor, FramedConfig
from wavetrain.features.registry import register_extractor

__all__ = ["IdentityConfig", "RMSConfig", "StatsConfig", "IdentityExtractor", "RMSExtractor",
           "StatsExtractor"]


@dataclass(frozen=True)
class IdentityConfig(FramedConfig):
    """Config of :class:`IdentityExtractor`."""


@register_extractor
class IdentityExtractor(Extractor):
    """Raw (resampled) samples of each sub-window as features (no window applied)."""

    name = "identity"
    config_type = IdentityConfig

    def _dim(self, rate: int, size: int | None) -> int:
        if size is None:
            raise ParameterError("identity with whole=true has a length-dependent feature count; "
                                 "set window_ms")
        return size

    def _kernel(self, frames: np.ndarray, state: Any, out: np.ndarray) -> None:
        out[...] = frames


@dataclass(frozen=True)
class RMSConfig(FramedConfig):
    """Config of :class:`RMSExtractor`."""


@register_extractor
class RMSExtractor(Extractor):
    """Root mean square sqrt(mean(x^2)) of each sub-window (1 feature)."""

    name = "rms"
    config_type = RMSConfig

    def _dim(self, rate: int, size: int | None) -> int:
        return 1

    def _kernel(self, frames: np.ndarray, state: Any, out: np.ndarray) -> None:
        ms = np.einsum("ij,ij->i", frames, frames, dtype=np.float64) / frames.shape[1]
        out[:, 0] = np.sqrt(ms)


@dataclass(frozen=True)
class StatsConfig(FramedConfig):
    """Config of :class:`StatsExtractor`."""


@register_extractor
class StatsExtractor(Extractor):
    """Statistics of |x| per sub-window: mean, min, max, sd (4 features, in that order)."""

    name = "stats"
    config_type = StatsConfig

    def _dim(self, rate: int, size: int | None) -> int:
        return 4

    def _kernel(self, frames: np.ndarray, state: Any, out: np.ndarray) -> None:
        a = np.abs(frames, out=frames)
        mean = a.mean(axis=1, dtype=np.float64)
        out[:, 0] = mean
        out[:, 1] = a.min(axis=1)
        out[:, 2] = a.max(axis=1)
        var = np.einsum("ij,ij->i", a, a, dtype=np.float64) / a.shape[1] - mean * mean
        out[:, 3] = np.sqrt(np.maximum(var, 0.0))
