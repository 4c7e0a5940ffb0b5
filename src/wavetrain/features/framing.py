"""Sub-window framing as stride views, and analysis windows.

Conventions: a sub-window of ``window_ms`` milliseconds at ``rate`` Hz has
``size = round(window_ms * rate / 1000)`` samples (spectral extractors zero-pad it to their
``n_fft``, see :func:`wavetrain.features.base.fft_length`);
frames start at ``t * step`` with ``step = max(1, round(size * shift_pct / 100))``; there is no
centring or padding, so a signal of ``n >= size`` samples gives ``1 + (n - size) // step``
frames and trailing samples that do not fill a frame are dropped (librosa ``center=False``).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from wavetrain.core.errors import AudioError, ParameterError

__all__ = ["frame", "frame_count", "window_size", "window_step", "get_window"]


def window_size(window_ms: float, rate: int) -> int:
    """Samples in one sub-window: ``round(window_ms * rate / 1000)``.

    Raises
    ------
    ParameterError
        If that is less than one sample.
    """
    size = int(round(window_ms * rate / 1000.0))
    if size < 1:
        raise ParameterError(f"window_ms={window_ms:g} at {rate} Hz is shorter than one sample; "
                             "use a longer window_ms")
    return size


def window_step(size: int, shift_pct: float) -> int:
    """Samples between frame starts: ``max(1, round(size * shift_pct / 100))``."""
    return max(1, int(round(size * shift_pct / 100.0)))


def frame_count(n: int, size: int, step: int) -> int:
    """Frames of ``size`` samples every ``step`` samples in ``n`` samples (0 if ``n < size``)."""
    return 0 if n < size else 1 + (n - size) // step


def frame(x: np.ndarray, size: int, step: int) -> np.ndarray:
    """Frame the last axis of ``x`` as a read-only stride view (no copy).

    Parameters
    ----------
    x : np.ndarray [shape=(..., n)]
        Signal(s); any dtype, any strides.
    size : int > 0
        Samples per frame.
    step : int > 0
        Samples between frame starts.

    Returns
    -------
    frames : np.ndarray [shape=(..., n_frames, size)]
        View sharing memory with ``x``.

    Raises
    ------
    AudioError
        If the signal is shorter than one frame.

    Examples
    --------
    >>> frame(np.arange(10.0), 4, 2)[:, 0]
    array([0., 2., 4., 6.])
    """
    n = x.shape[-1]
    if n < size:
        raise AudioError(f"signal of {n} samples is shorter than one sub-window of {size} samples; "
                         "use a shorter window_ms or whole=true")
    return sliding_window_view(x, size, axis=-1)[..., ::step, :]


@lru_cache(maxsize=64)
def _window(name: str, size: int) -> np.ndarray:
    n = np.arange(size, dtype=np.float64)
    if name == "hann":
        w = 0.5 - 0.5 * np.cos(2.0 * np.pi * n / size)
    elif name == "hamming":
        w = 0.54 - 0.46 * np.cos(2.0 * np.pi * n / size)
    elif name == "rect":
        w = np.ones(size)
    else:
        raise ParameterError(f"unknown window {name!r}: expected hann, hamming or rect")
    w = w.astype(np.float32)
    w.flags.writeable = False
    return w


def get_window(name: str, size: int) -> np.ndarray:
    """Periodic (DFT-even) analysis window, float32, shape ``(size,)``, read-only.

    ``hann`` and ``hamming`` equal ``scipy.signal.get_window(name, size, fftbins=True)``.
    """
    return _window(name, size)
