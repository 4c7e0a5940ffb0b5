"""Spectral extractors: ``fft`` magnitude, ``mel`` power, ``logmel`` and ``mfcc``.

Conventions (librosa-compatible with ``center=False``): the sub-window has
``size = round(window_ms * rate / 1000)`` samples and is multiplied by a periodic window of that
length, then zero-padded to ``n_fft`` (default ``fast``: the smallest ``2^a 3^b 5^c >= size``,
e.g. 1800 for 40 ms at 44.1 kHz; ``n_fft=none`` = no padding) -- librosa's
``n_fft=N, win_length=size`` with the window at the start of the frame; power spectrum
``|rfft(w * x, n_fft)|**2``, Slaney mel scale and Slaney area normalisation by default.
Log scale: natural log with ``eps = 1e-10`` (``log(mel + 1e-10)``).
MFCC: orthonormal DCT-II of that log-mel over bands, first ``coeffs`` kept.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from wavetrain.errors import ParameterError
from wavetrain.features._params import param
from wavetrain.features.base import Extractor, SpectralConfig
from wavetrain.features.fft import default_rfft
from wavetrain.features.filters import dct_matrix, mel_blocks_interleaved, resize_matrix
from wavetrain.features.registry import register_extractor

__all__ = ["FFTConfig", "MelConfig", "LogMelConfig", "MFCCConfig", "FFTExtractor",
           "MelExtractor", "LogMelExtractor", "MFCCExtractor", "LOG_EPS", "power_spectrum"]

#: Floor added before the natural log of power/magnitude features.
LOG_EPS = 1e-10


def power_spectrum(frames: np.ndarray, rfft=default_rfft) -> np.ndarray:
    """Power spectrum of windowed, zero-padded frames (the frames may be overwritten).

    Parameters
    ----------
    frames : np.ndarray [shape=(m, n_fft), dtype=float32]
    rfft : callable, default=default_rfft
        ``((m, n_fft) float32, n_fft) -> (m, n_fft // 2 + 1) complex64``.

    Returns
    -------
    power : np.ndarray [shape=(m, n_fft // 2 + 1), dtype=float32]
    """
    spec = rfft(frames, frames.shape[1])
    s = spec.view(np.float32)
    np.square(s, out=s)
    power = np.empty(spec.shape, dtype=np.float32)
    np.add(s[:, 0::2], s[:, 1::2], out=power)
    return power


def _check_range(name: str, fmin: float, fmax: float | None) -> None:
    if fmax is not None and fmax <= fmin:
        raise ParameterError(f"{name}.fmax: expected above fmin={fmin:g}, got {fmax:g}", param="fmax")


def _fmax(name: str, fmin: float, fmax: float | None, rate: int) -> float:
    top = rate / 2.0 if fmax is None else fmax
    if top > rate / 2.0 + 1e-9:
        raise ParameterError(f"{name}.fmax: {fmax:g} Hz is above the Nyquist frequency {rate / 2:g} Hz of the "
                             f"{rate} Hz signal; lower fmax or set rate", param="fmax")
    if fmin >= top:
        raise ParameterError(f"{name}.fmin: expected below fmax={top:g} Hz, got {fmin:g}", param="fmin")
    return top


# ---- FFT ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class FFTConfig(SpectralConfig):
    """Config of :class:`FFTExtractor`."""

    bins: int | None = param(None, "number of output bins, area-resampled over [fmin, fmax] "
                             "(none = the native rFFT bins in that range)", kind=int, low=1,
                             optional=True)
    fmin: float = param(0.0, "lowest frequency in Hz", kind=float, low=0.0)
    fmax: float | None = param(None, "highest frequency in Hz (none = rate / 2)", kind=float,
                               low=0.0, optional=True)
    log: bool = param(False, "natural log of the magnitude (+1e-10)", kind=bool)
    norm: str = param("none", "per-frame normalisation before the log: none, max (peak = 1) or "
                      "l2 (unit Euclidean norm)", kind=str, choices=("none", "max", "l2"))

    def _check(self) -> None:
        super()._check()
        _check_range(self.stage, self.fmin, self.fmax)


@register_extractor
class FFTExtractor(Extractor):
    """FFT magnitude |rfft(w x)| per sub-window, optionally limited, resized, normalised, logged."""

    name = "fft"
    config_type = FFTConfig
    windowed = True
    config: FFTConfig

    def _native(self, rate: int, size: int) -> tuple[int, int]:
        c = self.config
        top = _fmax(self.name, c.fmin, c.fmax, rate)
        size = self.fft_size(size)
        freqs = np.fft.rfftfreq(size, 1.0 / rate)
        sel = np.flatnonzero((freqs >= c.fmin - 1e-9) & (freqs <= top + 1e-9))
        if sel.size == 0:
            raise ParameterError(f"fft: no FFT bin of a {size}-sample window at {rate} Hz lies in "
                                 f"[{c.fmin:g}, {top:g}] Hz; widen the range or the window")
        return int(sel[0]), int(sel[-1]) + 1

    def _dim(self, rate: int, size: int | None) -> int:
        if self.config.bins is not None:
            _fmax(self.name, self.config.fmin, self.config.fmax, rate)
            return self.config.bins
        if size is None:
            raise ParameterError("fft with whole=true and bins=none has a length-dependent "
                                 "feature count; set bins")
        lo, hi = self._native(rate, size)
        return hi - lo

    def _state(self, rate: int, size: int) -> Any:
        lo, hi = self._native(rate, size)
        c = self.config
        resize = None
        if c.bins is not None:
            df = rate / self.fft_size(size)
            resize = resize_matrix((lo * df, df, hi - lo), c.fmin,
                                   _fmax(self.name, c.fmin, c.fmax, rate), c.bins)
        return lo, hi, resize

    def _kernel(self, frames: np.ndarray, state: Any, out: np.ndarray) -> None:
        lo, hi, resize = state
        mag = power_spectrum(frames, self.rfft)[:, lo:hi]
        np.sqrt(mag, out=mag)
        if resize is not None:
            np.matmul(mag, resize, out=out)
        else:
            out[...] = mag
        _finish_fft(out, self.config.norm, self.config.log)


def _finish_fft(out: np.ndarray, norm: str, log: bool) -> None:
    if norm == "max":
        out /= np.maximum(out.max(axis=-1, keepdims=True), np.float32(1e-30))
    elif norm == "l2":
        out /= np.maximum(np.sqrt(np.einsum("...f,...f->...", out, out))[..., None],
                          np.float32(1e-30))
    if log:
        out += np.float32(LOG_EPS)
        np.log(out, out=out)


# ---- mel ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class MelConfig(SpectralConfig):
    """Config of :class:`MelExtractor`."""

    bands: int = param(64, "number of mel bands", kind=int, low=1)
    fmin: float = param(0.0, "lowest filter edge in Hz", kind=float, low=0.0)
    fmax: float | None = param(None, "highest filter edge in Hz (none = rate / 2)", kind=float,
                               low=0.0, optional=True)
    htk: bool = param(False, "HTK mel scale instead of Slaney", kind=bool)
    norm: str = param("slaney", "filter normalisation: slaney (area) or none (peak 1)",
                      kind=str, choices=("slaney", "none"))

    def _check(self) -> None:
        super()._check()
        _check_range(self.stage, self.fmin, self.fmax)


@register_extractor
class MelExtractor(Extractor):
    """Mel filter-bank power spectrum (librosa melspectrogram, power=2, center=False)."""

    name = "mel"
    config_type = MelConfig
    windowed = True
    log = False
    config: MelConfig

    def _dim(self, rate: int, size: int | None) -> int:
        _fmax(self.name, self.config.fmin, self.config.fmax, rate)
        return self.config.bands

    def mel_args(self, rate: int, size: int) -> tuple:
        c = self.config
        return (rate, self.fft_size(size), c.bands, c.fmin,
                _fmax(self.name, c.fmin, c.fmax, rate), c.htk, c.norm)

    def _state(self, rate: int, size: int) -> Any:
        return mel_blocks_interleaved(*self.mel_args(rate, size))

    def _mel(self, frames: np.ndarray, blocks: tuple, out: np.ndarray) -> None:
        spec = self.rfft(frames, frames.shape[1])  # frames are zero-padded to n_fft
        sq = spec.view(np.float32)  # (m, 2K) interleaved re, im
        np.square(sq, out=sq)
        if len(blocks) == 0 or blocks[0][2] > 0 or sum(b[3] - b[2] for b in blocks) < out.shape[1]:
            out[...] = 0.0
        for lo, hi, b0, b1, w in blocks:
            np.matmul(sq[:, 2 * lo:2 * hi], w, out=out[:, b0:b1])
        if self.log:
            out += np.float32(LOG_EPS)
            np.log(out, out=out)

    def _kernel(self, frames: np.ndarray, state: Any, out: np.ndarray) -> None:
        self._mel(frames, state, out)


@dataclass(frozen=True)
class LogMelConfig(MelConfig):
    """Config of :class:`LogMelExtractor`."""


@register_extractor
class LogMelExtractor(MelExtractor):
    """Log mel power: log(mel + 1e-10), natural log."""

    name = "logmel"
    config_type = LogMelConfig
    log = True


@dataclass(frozen=True)
class MFCCConfig(MelConfig):
    """Config of :class:`MFCCExtractor`."""

    coeffs: int = param(13, "number of cepstral coefficients kept (<= bands)", kind=int, low=1)

    def _check(self) -> None:
        super()._check()
        if self.coeffs > self.bands:
            raise ParameterError(f"mfcc.coeffs: expected at most bands={self.bands}, got {self.coeffs}",
                                 param="coeffs")


@register_extractor
class MFCCExtractor(MelExtractor):
    """MFCC: orthonormal DCT-II over bands of log(mel + 1e-10), first `coeffs` kept."""

    name = "mfcc"
    config_type = MFCCConfig
    log = True
    config: MFCCConfig

    def _dim(self, rate: int, size: int | None) -> int:
        super()._dim(rate, size)
        return self.config.coeffs

    def _state(self, rate: int, size: int) -> Any:
        return super()._state(rate, size), dct_matrix(self.config.bands, self.config.coeffs)

    def _kernel(self, frames: np.ndarray, state: Any, out: np.ndarray) -> None:
        blocks, dct = state
        logmel = np.empty((frames.shape[0], self.config.bands), dtype=np.float32)
        self._mel(frames, blocks, logmel)
        np.matmul(logmel, dct, out=out)
