"""Real-FFT backends of the CPU extraction path.

Every spectral extractor calls one function, ``rfft(frames, n) -> spectrum``: float32 frames
``(m, size)`` zero-padded to ``n >= size`` (the input may be used as scratch) to their complex64
half spectrum ``(m, n // 2 + 1)``, single-threaded.  Two backends implement it:

``scipy``
    scipy's pocketfft: portable, always installed.
``mkl``
    Intel MKL's DFT through the ``mkl_fft`` package: the optional ``fast-fft`` extra (x86-64
    Linux, about 1 GB of libraries).  It transforms a frame 1.3-1.7x as fast as pocketfft, but the
    transform is a small part of a run: ``benchmarks/bench_fft.py`` measures extraction 2-14 %
    faster, ``wavetrain train`` 0-2 % and ``wavetrain features`` about 13 % (most of it the
    0.2 s of CPU scipy's FFT module takes to load, once per process) on the project's machine
    (BENCHMARKS.md), which is why it is not installed by default.

``WAVETRAIN_FFT=auto|mkl|scipy`` chooses (``auto``, the default, takes ``mkl`` when it imports).
The two agree to float32 rounding (about 1e-6 relative); the librosa parity tests run on
whichever is active.  The backend's module is imported on the first transform, not with wavetrain.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable

import numpy as np

from wavetrain.core.errors import ParameterError
from wavetrain.core.extras import has_module, install_hint

__all__ = ["BACKENDS", "BackendError", "check_backend", "fft_backend", "get_rfft", "default_rfft",
           "backend_module", "scipy_rfft", "mkl_rfft"]

#: Accepted values of ``WAVETRAIN_FFT``.
BACKENDS = ("auto", "mkl", "scipy")

RFFT = Callable[[np.ndarray, int], np.ndarray]

class BackendError(ParameterError):
    """``WAVETRAIN_FFT`` names an unknown backend, or one that cannot be used here (a setting of
    the run, never a fault of the recording being extracted)."""


_lock = threading.Lock()
_resolved: dict[str, str] = {}


def scipy_rfft(frames: np.ndarray, n: int) -> np.ndarray:
    """Single-thread float32 ``n``-point real FFT of the rows by scipy (input may be scratch)."""
    import scipy.fft as sfft
    return sfft.rfft(frames, n=n, axis=-1, workers=1, overwrite_x=True)


def mkl_rfft(frames: np.ndarray, n: int) -> np.ndarray:
    """Float32 ``n``-point real FFT of the rows by Intel MKL (``mkl_fft``; one thread)."""
    import mkl_fft
    return mkl_fft.rfft(frames, n=n, axis=-1)


def _mkl_available() -> bool:
    try:
        import mkl_fft  # noqa: F401
    except Exception:  # ImportError, or a broken MKL install (missing shared library)
        return False
    return True


def fft_backend(requested: str | None = None) -> str:
    """The backend that runs: ``"mkl"`` or ``"scipy"``.

    Parameters
    ----------
    requested : {"auto", "mkl", "scipy"}, optional
        Default: ``$WAVETRAIN_FFT`` or ``"auto"``.

    Raises
    ------
    ParameterError
        For an unknown name, or ``"mkl"`` when mkl_fft cannot be imported.
    """
    name = _requested_name(requested)
    done = _resolved.get(name)
    if done is not None:
        return done
    with _lock:
        if name not in _resolved:
            if name == "scipy":
                _resolved[name] = "scipy"
            elif _mkl_available():
                _resolved[name] = "mkl"
            elif name == "mkl":
                raise BackendError("FFT backend 'mkl' requested but mkl_fft does not import: "
                                   f"{install_hint('fast-fft')}, or set WAVETRAIN_FFT=scipy")
            else:
                _resolved[name] = "scipy"
        return _resolved[name]


def _requested_name(requested: str | None) -> str:
    name = (requested or os.environ.get("WAVETRAIN_FFT") or "auto").strip().lower()
    if name not in BACKENDS:
        raise BackendError(f"unknown FFT backend {name!r} (WAVETRAIN_FFT): expected one of "
                           + ", ".join(BACKENDS))
    return name


def check_backend(requested: str | None = None) -> None:
    """Fail early (before any recording is read) on an unusable ``WAVETRAIN_FFT``, without
    importing the backend: an unknown name, or ``mkl`` where mkl_fft is not installed."""
    name = _requested_name(requested)
    if name == "mkl" and backend_module(name) != "mkl_fft":
        raise BackendError("FFT backend 'mkl' requested but mkl_fft is not installed: "
                           f"{install_hint('fast-fft')}, or set WAVETRAIN_FFT=scipy")


def backend_module(requested: str | None = None) -> str:
    """The module the backend will import (``"mkl_fft"`` or ``"scipy.fft"``), found without
    importing it (the memory planner counts its import cost before the run)."""
    name = _requested_name(requested)
    if name in _resolved:
        return "mkl_fft" if _resolved[name] == "mkl" else "scipy.fft"
    if name == "scipy":
        return "scipy.fft"
    return "mkl_fft" if has_module("mkl_fft") else "scipy.fft"


def get_rfft(requested: str | None = None) -> RFFT:
    """The real-FFT function of :func:`fft_backend` ``(requested)``."""
    return mkl_rfft if fft_backend(requested) == "mkl" else scipy_rfft


def default_rfft(frames: np.ndarray, n: int) -> np.ndarray:
    """Real FFT by the backend chosen by ``WAVETRAIN_FFT`` (resolved on the first call)."""
    return get_rfft()(frames, n)
