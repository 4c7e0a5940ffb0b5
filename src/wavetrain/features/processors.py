"""Processors: stages applied to extracted features ``(batch, frames, features)``.

``delta`` (velocity/acceleration), ``normalize`` (zero mean / unit sd over time or features),
``cmvn`` (zero mean / unit sd over a sliding window of frames), ``dct`` (cepstrum of each frame),
``lpnorm`` (divide by the Lp norm), ``lp`` and ``l1`` (reduce to the Lp / L1 magnitude), ``pool``
(a clip's frames to one: mean, max and standard deviation of each feature).
A spec's ``| a(...) | b(...)`` chain is a :class:`Pipeline`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, cast

import numpy as np

from wavetrain.core.errors import ParameterError
from wavetrain.features._params import Config, param
from wavetrain.features.filters import dct_matrix
from wavetrain.features.registry import PROCESSORS, register_processor

__all__ = ["Processor", "Pipeline", "DeltaConfig", "NormalizeConfig", "CMVNConfig", "DCTConfig",
           "LpConfig", "LpNormConfig", "L1Config", "PoolConfig", "Pool", "Delta", "Normalize", "CMVN", "DCT",
           "Lp", "L1", "LpNorm", "delta", "sliding_cmvn"]


class Processor:
    """Base class of a registered processor built from its config."""

    name: ClassVar[str] = ""
    config_type: ClassVar[type[Config]] = Config

    def __init__(self, config: Config) -> None:
        self.config = config

    def feature_dim(self, in_dim: int) -> int:
        """Features per frame out, given ``in_dim`` in."""
        return in_dim

    def n_frames(self, in_frames: int) -> int:
        """Frames out, given ``in_frames`` in."""
        return in_frames

    def process(self, feats: np.ndarray) -> np.ndarray:
        """Apply to ``feats`` of shape ``(batch, frames, features)``, float32; returns float32."""
        raise NotImplementedError


class Pipeline:
    """Processors applied in order."""

    def __init__(self, processors: tuple[Processor, ...] | list[Processor]) -> None:
        self.processors = tuple(processors)

    def feature_dim(self, in_dim: int) -> int:
        for p in self.processors:
            in_dim = p.feature_dim(in_dim)
        return in_dim

    def n_frames(self, in_frames: int) -> int:
        for p in self.processors:
            in_frames = p.n_frames(in_frames)
        return in_frames

    def process(self, feats: np.ndarray) -> np.ndarray:
        for p in self.processors:
            feats = p.process(feats)
        return feats


# ---- delta -------------------------------------------------------------------------------
def delta(feats: np.ndarray, *, half: int = 2, weights: str = "linear") -> np.ndarray:
    """Regression delta over time (axis -2), edges padded by repetition.

    ``d[t] = sum_n w_n (x[t+n] - x[t-n]) / (2 sum_n n w_n)``, ``n = 1..half``, with
    ``w_n = n`` (``linear``, the HTK/librosa-style slope) or ``w_n = 1`` (``uniform``).
    For a linear ramp ``x[t] = a t`` both give ``d = a`` away from the edges.

    Parameters
    ----------
    feats : np.ndarray [shape=(..., frames, features)]
    half : int > 0
        Half-window in frames.
    weights : {'linear', 'uniform'}

    Returns
    -------
    np.ndarray [shape=(..., frames, features), dtype=float32]
    """
    t = feats.shape[-2]
    ns = np.arange(1, half + 1)
    w = ns.astype(np.float64) if weights == "linear" else np.ones(half)
    denom = 2.0 * float(np.sum(ns * w))
    out = np.zeros(feats.shape, dtype=np.float32)
    idx = np.arange(t)
    for n, wn in zip(ns, w):
        fwd = feats[..., np.minimum(idx + n, t - 1), :]
        bwd = feats[..., np.maximum(idx - n, 0), :]
        out += np.float32(wn / denom) * (fwd - bwd)
    return out


@dataclass(frozen=True)
class DeltaConfig(Config):
    """Config of :class:`Delta`."""

    order: int = param(2, "1 = append velocity, 2 = velocity and acceleration", kind=int,
                       low=1, high=2)
    half: int = param(2, "half-window in frames", kind=int, low=1)
    weights: str = param("linear", "regression weights w_n = n (linear) or 1 (uniform)",
                         kind=str, choices=("linear", "uniform"))
    keep: bool = param(True, "keep the static features in front", kind=bool)


@register_processor
class Delta(Processor):
    """Delta features: velocity and acceleration appended along features ([x, d, dd])."""

    name = "delta"
    config_type = DeltaConfig
    config: DeltaConfig

    def feature_dim(self, in_dim: int) -> int:
        return in_dim * (self.config.order + int(self.config.keep))

    def process(self, feats: np.ndarray) -> np.ndarray:
        c = self.config
        parts = [feats] if c.keep else []
        d = feats
        for _ in range(c.order):
            d = delta(d, half=c.half, weights=c.weights)
            parts.append(d)
        return np.concatenate(parts, axis=-1).astype(np.float32, copy=False)


# ---- normalize ---------------------------------------------------------------------------
@dataclass(frozen=True)
class NormalizeConfig(Config):
    """Config of :class:`Normalize`."""

    axis: str = param("time", "normalise each feature across time, or each frame across "
                      "features", kind=str, choices=("time", "features"))
    mean: bool = param(True, "subtract the mean", kind=bool)
    std: bool = param(True, "divide by the standard deviation", kind=bool)
    eps: float = param(1e-8, "floor added to the standard deviation", kind=float, low=0.0)


@register_processor
class Normalize(Processor):
    """Per-clip zero mean / unit sd, across time (per feature) or across features (per frame)."""

    name = "normalize"
    config_type = NormalizeConfig
    config: NormalizeConfig

    def process(self, feats: np.ndarray) -> np.ndarray:
        c = self.config
        ax = -2 if c.axis == "time" else -1
        x = feats.astype(np.float64)
        if c.mean:
            x -= x.mean(axis=ax, keepdims=True)
        if c.std:
            x /= x.std(axis=ax, keepdims=True) + c.eps
        return x.astype(np.float32)


# ---- cmvn --------------------------------------------------------------------------------
def sliding_cmvn(feats: np.ndarray, window: int, *, var: bool = True, eps: float = 1e-8) -> np.ndarray:
    """Mean (and variance) normalisation of each feature over a centred sliding window of frames.

    Frame ``t`` is normalised with the mean and sd (population, ``ddof=0``) of frames
    ``t - window // 2`` to ``t + (window - 1) // 2`` (``window`` frames, centred; an even window
    has one more frame before ``t`` than after), clipped to the recording: near its edges fewer
    frames are used. ``window = 0`` or ``window >= 2 * frames`` uses every frame for every frame
    (``normalize(axis=time)``). Vectorised with cumulative sums accumulated in float64 (after
    subtracting each feature's overall mean, so that long recordings of large values keep their
    precision).

    Parameters
    ----------
    feats : np.ndarray [shape=(..., frames, features)]
    window : int >= 0
        Window length in frames.
    var : bool, default=True
        Also divide by the window's sd (+ ``eps``).
    eps : float, default=1e-8

    Returns
    -------
    np.ndarray [shape=feats.shape, dtype=float32]
    """
    x = np.asarray(feats, dtype=np.float64)
    t = x.shape[-2]
    if window <= 0 or window >= 2 * t:  # every window covers the whole recording
        x = x - x.mean(axis=-2, keepdims=True)
        if var:
            x /= x.std(axis=-2, keepdims=True) + eps
        return x.astype(np.float32)
    x = x - x.mean(axis=-2, keepdims=True)
    pad = [(0, 0)] * x.ndim
    pad[-2] = (1, 0)
    c1 = np.pad(np.cumsum(x, axis=-2), pad)  # c1[k] = sum of frames [0, k)
    idx = np.arange(t)
    lo = np.maximum(idx - window // 2, 0)
    hi = np.minimum(idx + (window - 1) // 2 + 1, t)
    n = (hi - lo).astype(np.float64)[:, None]
    mean = (c1[..., hi, :] - c1[..., lo, :]) / n
    del c1
    out = x - mean
    if var:
        c2 = np.pad(np.cumsum(np.square(x), axis=-2), pad)
        m2 = (c2[..., hi, :] - c2[..., lo, :]) / n
        del c2
        m2 -= np.square(mean)
        np.maximum(m2, 0.0, out=m2)  # (rounding of a constant window)
        np.sqrt(m2, out=m2)
        m2 += eps
        out /= m2
    return out.astype(np.float32)


@dataclass(frozen=True)
class CMVNConfig(Config):
    """Config of :class:`CMVN`."""

    window_frames: int = param(300, "frames of the centred sliding window (0 = the whole "
                               "recording); near the edges the frames available", kind=int, low=0)
    var: bool = param(True, "also divide by the window's standard deviation", kind=bool)
    eps: float = param(1e-8, "floor added to the standard deviation", kind=float, low=0.0)


@register_processor
class CMVN(Processor):
    """Sliding-window mean/variance normalisation of each feature over time (per recording)."""

    name = "cmvn"
    config_type = CMVNConfig
    config: CMVNConfig

    def process(self, feats: np.ndarray) -> np.ndarray:
        c = self.config
        return sliding_cmvn(feats, c.window_frames, var=c.var, eps=c.eps)


# ---- dct ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class DCTConfig(Config):
    """Config of :class:`DCT`."""

    coeffs: int = param(13, "coefficients kept (the first; at most the features in)", kind=int, low=1)


@register_processor
class DCT(Processor):
    """Orthonormal DCT-II across the features of each frame, first `coeffs` kept (a cepstrum)."""

    name = "dct"
    config_type = DCTConfig
    config: DCTConfig

    def feature_dim(self, in_dim: int) -> int:
        if self.config.coeffs > in_dim:
            raise ParameterError(f"dct.coeffs: expected at most the {in_dim} features of each frame, got "
                                 f"{self.config.coeffs}", param="coeffs")
        return self.config.coeffs

    def process(self, feats: np.ndarray) -> np.ndarray:
        d = dct_matrix(feats.shape[-1], self.feature_dim(feats.shape[-1]))
        return np.matmul(feats.astype(np.float32, copy=False), d)


# ---- Lp ----------------------------------------------------------------------------------
def _lp(x: np.ndarray, p: float, axis: int) -> np.ndarray:
    a = np.abs(x.astype(np.float64))
    if np.isinf(p):
        return a.max(axis=axis, keepdims=True)
    return np.sum(a ** p, axis=axis, keepdims=True) ** (1.0 / p)


_OVER: dict[str, Any] = dict(kind=str, choices=("features", "time"))


@dataclass(frozen=True)
class LpConfig(Config):
    """Config of :class:`Lp`."""

    p: float = param(2.0, "norm order p (1 = sum of |x|, 2 = Euclidean)", kind=float, low=1.0)
    over: str = param("features", "reduce across features (one value per frame) or across "
                      "time (one frame per clip)", **_OVER)


@register_processor
class Lp(Processor):
    """Lp magnitude reduction (sum |x|^p)^(1/p) across features or across time."""

    name = "lp"
    config_type: ClassVar[type[Config]] = LpConfig
    #: L1 (a subclass) has an L1Config, which has ``over`` but no ``p``.
    config: LpConfig | L1Config

    def feature_dim(self, in_dim: int) -> int:
        return 1 if self.config.over == "features" else in_dim

    def n_frames(self, in_frames: int) -> int:
        return in_frames if self.config.over == "features" else 1

    def process(self, feats: np.ndarray) -> np.ndarray:
        ax = -1 if self.config.over == "features" else -2
        # an Lp's own config: L1, whose L1Config has no p, overrides process
        return _lp(feats, cast(LpConfig, self.config).p, ax).astype(np.float32)


@dataclass(frozen=True)
class L1Config(Config):
    """Config of :class:`L1`."""

    over: str = param("features", "reduce across features or across time", **_OVER)


@register_processor
class L1(Lp):
    """L1 magnitude reduction sum |x| across features or across time."""

    name = "l1"
    config_type = L1Config
    config: L1Config

    def process(self, feats: np.ndarray) -> np.ndarray:
        ax = -1 if self.config.over == "features" else -2
        return _lp(feats, 1.0, ax).astype(np.float32)


@dataclass(frozen=True)
class LpNormConfig(Config):
    """Config of :class:`LpNorm`."""

    p: float = param(2.0, "norm order p", kind=float, low=1.0)
    over: str = param("features", "normalise each frame (features) or each feature (time)",
                      **_OVER)
    eps: float = param(1e-12, "floor of the norm", kind=float, low=0.0)


@register_processor
class LpNorm(Processor):
    """Lp normalisation: divide by the Lp norm across features (per frame) or across time."""

    name = "lpnorm"
    config_type = LpNormConfig
    config: LpNormConfig

    def process(self, feats: np.ndarray) -> np.ndarray:
        c = self.config
        ax = -1 if c.over == "features" else -2
        norm = np.maximum(_lp(feats, c.p, ax), c.eps)
        return (feats / norm).astype(np.float32)


# ---- pool ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PoolConfig(Config):
    """Config of :class:`Pool`."""

    mean: bool = param(True, "the mean of each feature over the clip's frames", kind=bool)
    max: bool = param(True, "the maximum of each feature", kind=bool)
    sd: bool = param(False, "the standard deviation of each feature (population, 0 for one frame)", kind=bool)

    def _check(self) -> None:
        if not (self.mean or self.max or self.sd):
            raise ParameterError("pool: choose one or more of mean, max and sd", param="mean")


@register_processor
class Pool(Processor):
    """Pool the frames of a clip into one: mean, max and/or sd of each feature, side by side (in that order)."""

    name = "pool"
    config_type = PoolConfig
    config: PoolConfig

    def feature_dim(self, in_dim: int) -> int:
        return in_dim * (int(self.config.mean) + int(self.config.max) + int(self.config.sd))

    def n_frames(self, in_frames: int) -> int:
        return 1 if in_frames else 0

    def process(self, feats: np.ndarray) -> np.ndarray:
        c = self.config
        x = feats.astype(np.float64)
        mean = x.mean(axis=-2, keepdims=True)
        out = []
        if c.mean:
            out.append(mean)
        if c.max:
            out.append(x.max(axis=-2, keepdims=True))
        if c.sd:
            out.append(np.sqrt(np.maximum(np.mean(np.square(x - mean), axis=-2, keepdims=True), 0.0)))
        return np.concatenate(out, axis=-1).astype(np.float32)


def build(config: Any) -> Processor:
    """Processor instance for a processor config."""
    return PROCESSORS[config.stage](config)
