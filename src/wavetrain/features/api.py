"""The public feature API: :func:`extract` (and :func:`~wavetrain.core.signal.resample`, which
the data layer shares)."""
from __future__ import annotations

from collections.abc import Callable
from typing import cast

import numpy as np

from wavetrain.core.devices import FEATURE_DEVICES, check_device
from wavetrain.core.errors import AudioError, ParameterError
from wavetrain.core.signal import resample
from wavetrain.features.combined import align_parts, extract_blocks_combined
from wavetrain.features.spec import CombinedSpec, FeatureSpec, parse_spec

__all__ = ["extract", "extract_blocks", "resample", "check_samples"]



def check_samples(x: np.ndarray, what: str = "samples") -> np.ndarray:
    """Validate a signal array: real numbers, non-empty, finite (no extra memory).

    Raises
    ------
    AudioError
        Empty, non-numeric, NaN or infinite samples.
    """
    x = np.asarray(x)
    if x.dtype.kind not in "fiu" or x.dtype == np.float16:
        if x.dtype == np.float16:
            return check_samples(x.astype(np.float32), what)
        raise AudioError(f"{what} must be real numbers (float or int), got dtype {x.dtype}")
    if x.size == 0:
        raise AudioError(f"{what} are empty (shape {x.shape}): a zero-length clip has no features")
    if x.dtype.kind == "f" and not _all_finite(x):
        bad = int(np.count_nonzero(~np.isfinite(x)))
        raise AudioError(f"{what} contain {bad} NaN or infinite value(s) of {x.size}; clean or "
                         "drop the recording")
    return x


def _all_finite(x: np.ndarray) -> bool:
    """Whether every value is finite: one BLAS dot product (NaN and inf propagate into it; about
    half the cost of min + max) and, only if that overflowed or is not finite, the exact check."""
    if x.ndim == 1 and x.dtype in (np.float32, np.float64):
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow only means: check exactly
            if np.isfinite(np.dot(x, x)):
                return True
    return bool(np.isfinite(np.min(x)) and np.isfinite(np.max(x)))


def _check_features(feats: np.ndarray) -> None:
    """Features overflow to inf/NaN only when the samples are far beyond [-1, 1]."""
    if not (np.isfinite(np.min(feats)) and np.isfinite(np.max(feats))):
        raise AudioError("features are not finite (samples too large for float32 arithmetic?); "
                         "scale the signal to about [-1, 1]")


def _layout(x: np.ndarray, per_axis: bool) -> tuple[np.ndarray, bool, int]:
    """Return (x as (B, n[, C]), was_1d_batch, channels)."""
    if per_axis:
        if x.ndim == 1:
            x = x[:, None]
        if x.ndim == 2:
            return x[None], True, x.shape[-1]
        if x.ndim == 3:
            return x, False, x.shape[-1]
        raise ParameterError(f"per_axis samples must have shape (n, channels) or "
                             f"(batch, n, channels), got {x.shape}")
    if x.ndim == 1:
        return x[None], True, 1
    if x.ndim == 2:
        return x, False, 1
    raise ParameterError(f"samples must have shape (n,) or (batch, n), got {x.shape}; "
                         "downmix multi-channel audio or use per_axis=true")


def extract(samples: np.ndarray, rate: int, spec: str | FeatureSpec, *,
            device: str = "cpu") -> np.ndarray:
    """Extract features from one signal or a batch of equally long signals.

    Parameters
    ----------
    samples : np.ndarray
        ``(n,)`` or ``(batch, n)``; with ``per_axis`` the last axis is channels:
        ``(n, C)`` or ``(batch, n, C)``.  Any real dtype; values are used as given.
    rate : int
        Sample rate of ``samples`` in Hz; resampled to ``spec.rate`` first if that is set.
    spec : str or FeatureSpec
        Feature spec, e.g. ``"logmel(bands=64)"``.
    device : {'cpu', 'cpu-torch', 'cuda', 'cuda:N'}, default='cpu'
        ``cpu`` = numpy/scipy; ``cpu-torch`` and ``cuda`` run the extractor with torch
        (imported only then); processors always run in numpy.

    Returns
    -------
    feats : np.ndarray [dtype=float32]
        ``(frames, features)`` for 1-D input, ``(batch, frames, features)`` for batches;
        per-axis features are concatenated channel by channel (``C * features``).  A combined
        spec (``A + B``) extracts every part from these samples (resampled once) and aligns
        them onto the first part's frames (:mod:`wavetrain.features.combined`).

    Raises
    ------
    AudioError
        Empty, NaN/inf samples, or a signal shorter than one sub-window.
    SpecError, ParameterError
        Invalid spec, rate or device.

    Examples
    --------
    >>> y = np.sin(2 * np.pi * 440 * np.arange(16000) / 16000).astype(np.float32)
    >>> extract(y, 16000, "logmel(bands=40)").shape
    (49, 40)
    """
    spec = parse_spec(spec)
    if isinstance(rate, bool) or not float(rate).is_integer() or rate <= 0:
        raise ParameterError(f"rate={rate!r} must be a positive integer sample rate in Hz")
    rate = int(rate)
    dev = check_device(device, FEATURE_DEVICES)
    x = check_samples(samples)
    xb, single, channels = _layout(x, spec.per_axis)
    target = spec.rate or rate
    if target != rate:
        xb = resample(xb, rate, target, axis=1)
    if isinstance(spec, CombinedSpec):  # one decode (and resampling) for every part
        grams = [extract(xb, target, part, device=dev) for part in spec.parts]
        feats = align_parts(spec, grams, xb.shape[1], target)
        return feats[0] if single else feats
    extractor = spec.build_extractor()
    run: Callable[[np.ndarray, int], np.ndarray]
    if dev == "cpu":
        run = extractor.extract_batch
    else:
        from wavetrain.features.torch_backend import extract_batch_torch

        def run(sig: np.ndarray, r: int) -> np.ndarray:
            return extract_batch_torch(extractor, sig, r, dev)
    if spec.per_axis:
        feats = np.concatenate([run(xb[..., c], target) for c in range(channels)], axis=-1)
    else:
        feats = run(xb, target)
    if spec.processors:
        feats = spec.build_pipeline().process(feats)
    _check_features(feats)
    return feats[0] if single else feats


def extract_blocks(read, n: int, rate: int, spec, *, block_s: float = 30.0) -> np.ndarray | None:
    """Features of a long mono signal decoded block by block.

    Parameters
    ----------
    read : callable ``(start, stop) -> np.ndarray``
        Returns samples ``[start, stop)`` (float32, mono) of the signal.
    n : int
        Length of the signal in samples.
    rate : int
        Its sample rate in Hz.
    spec : str or FeatureSpec
    block_s : float, default=30.0
        Seconds of audio decoded at a time.

    Returns
    -------
    np.ndarray [shape=(frames, features), dtype=float32] or None
        The same features as ``extract(read(0, n), rate, spec)``, with memory of one block plus
        the output; ``None`` when the spec needs the whole signal at once (resampling, per-axis or
        whole-clip specs), so the caller extracts it whole.  A combined spec reads each block once
        for all its parts.
    """
    spec = parse_spec(spec)
    if isinstance(spec, CombinedSpec):
        combined = extract_blocks_combined(read, n, rate, spec, block_s, check_samples)
        if combined is not None:
            _check_features(combined)
        return combined
    if (spec.rate not in (None, rate)) or spec.per_axis:
        return None
    ext = spec.build_extractor()
    if getattr(ext.config, "whole", False) or ext.pad_to(n, rate) > n:
        return None
    size = ext.frame_size(rate)
    step = ext.frame_step(rate, size)
    if n < size:
        x = check_samples(read(0, n))
        return extract(x, rate, spec)  # raises the usual "shorter than one sub-window" error
    total = 1 + (n - size) // step
    per_block = max(1, int(block_s * rate) // step)
    out: np.ndarray | None = None
    for f0 in range(0, total, per_block):
        f1 = min(total, f0 + per_block)
        x = check_samples(read(f0 * step, (f1 - 1) * step + size))
        g = ext.extract_batch(x[None], rate)[0]
        if out is None:
            out = np.empty((total, g.shape[1]), dtype=np.float32)
        out[f0:f1] = g
    out = cast(np.ndarray, out)  # total >= 1 (n >= size), so the loop ran and allocated it
    if spec.processors:
        out = spec.build_pipeline().process(out[None])[0]
    _check_features(out)
    return out
