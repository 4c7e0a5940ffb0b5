"""Signal functions that both the data layer (a recording read at another rate) and the
features layer use."""
from __future__ import annotations

from math import gcd

import numpy as np

from wavetrain.core.errors import ParameterError

__all__ = ["MAX_RATE", "MIN_RATE", "resample"]

#: The sample rates, in Hz, that a user may name for audio (a recording's rate, a rate to write or
#: resample to): 1 kHz to 768 kHz, the highest rate of common audio interfaces.
MIN_RATE, MAX_RATE = 1_000, 768_000


def resample(samples: np.ndarray, rate_in: int, rate_out: int, *, axis: int = -1) -> np.ndarray:
    """Polyphase resampling (``scipy.signal.resample_poly``, Kaiser window).

    Parameters
    ----------
    samples : np.ndarray [shape=(n,) or (batch, n)]
        Signal(s); time is the last axis (or ``axis``).
    rate_in, rate_out : int
        Sample rates in Hz.
    axis : int, default=-1
        Time axis.

    Returns
    -------
    np.ndarray [shape=(..., ceil(n * rate_out / rate_in)), dtype=float32]
        A float32 view or copy of the input when the rates are equal.

    Raises
    ------
    ParameterError
        If a rate is not a positive integer.
    """
    for name, r in (("rate_in", rate_in), ("rate_out", rate_out)):
        if isinstance(r, bool) or not float(r).is_integer() or r <= 0:
            raise ParameterError(f"resample: {name}={r!r} must be a positive integer in Hz")
    rate_in, rate_out = int(rate_in), int(rate_out)
    x = np.asarray(samples)
    if rate_in == rate_out:
        return x.astype(np.float32, copy=False)
    from scipy.signal import resample_poly
    g = gcd(rate_in, rate_out)
    y = resample_poly(x.astype(np.float32, copy=False), rate_out // g, rate_in // g, axis=axis)
    return y.astype(np.float32, copy=False)
