"""Spectral extractors: ``fft`` magnitude, ``mel`` power, ``logmel`` and ``mfcc``.

Conventions (librosa-compatible with ``center=False``): the sub-window has
``size = round(window_ms * rate / 1000)`` samples and is multiplied by a periodic window of that
length, then zero-padded to ``n_fft`` (default ``fast``: the smallest ``2^a 3^b 5^c >= size``,
e.g. 1800 for 40 ms at 44.1 kHz; ``n_fft=none`` = no padding) -- librosa's
``n_fft=N, win_length=size`` with the window at the start of the frame; power spectrum
``|rfft(w * x, n_fft)|**2``, Slaney mel scale and Slaney area normalisation by default.
Log scale: natural log with ``eps = 1e-10`` (``log(mel + 1e-10)``).
MFCC: orthonormal DCT-II of that log-mel over bands, first ``coeffs`` kept.
PCEN: per-channel energy normalisation of that mel power (see :func:`pcen`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from wavetrain.core.errors import ParameterError
from wavetrain.features._params import param
from wavetrain.features.base import Extractor, SpectralConfig
from wavetrain.features.fft import default_rfft
from wavetrain.features.filters import dct_matrix, mel_blocks_interleaved, resize_matrix
from wavetrain.features.registry import register_extractor

__all__ = ["FFTConfig", "MelConfig", "LogMelConfig", "MFCCConfig", "PCENConfig", "FFTExtractor",
           "MelExtractor", "LogMelExtractor", "MFCCExtractor", "PCENExtractor", "LOG_EPS",
           "pcen", "pcen_smoothing", "power_spectrum"]

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
    warp: float = param(1.0, "vocal tract length warp of the band edges (piecewise linear, as Kaldi's VTLN): "
                        "above 1 every band moves down by that factor, to meet a voice whose formants lie lower",
                        kind=float, low=0.5, high=2.0)
    quiet_defaults: ClassVar[tuple[str, ...]] = ("warp",)

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
                _fmax(self.name, c.fmin, c.fmax, rate), c.htk, c.norm, c.warp)

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


# ---- PCEN --------------------------------------------------------------------------------
def pcen_smoothing(time_constant: float, frame_shift_s: float) -> float:
    """Weight ``b`` of the PCEN smoother ``M[t] = b S[t] + (1 - b) M[t-1]`` (librosa's choice).

    With ``T = time_constant / frame_shift_s`` frames, ``b = (sqrt(1 + 4 T^2) - 1) / (2 T^2)``
    (the full width at half maximum of the filter's squared response is about ``T`` frames);
    ``b = 1`` (no smoothing) for a single whole-clip frame (``frame_shift_s = 0``).
    """
    if frame_shift_s <= 0.0:
        return 1.0
    t = time_constant / frame_shift_s
    return float((np.sqrt(1.0 + 4.0 * t * t) - 1.0) / (2.0 * t * t))


def pcen(mel: np.ndarray, b: float, *, gain: float = 0.98, bias: float = 2.0, power: float = 0.5,
         eps: float = 1e-6, zi: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel energy normalisation (Wang et al. 2017) of a power spectrogram, over time.

    ``M = lfilter([b], [1, b - 1], S)`` along frames, then
    ``P = bias^power * ((1 + S / (bias (eps + M)^gain))^power - 1)`` (``power = 0``:
    ``log1p(S / (eps + M)^gain)``; ``bias = 0``: ``(S / (eps + M)^gain)^power``) -- the formulas
    of ``librosa.pcen`` (0.11, ``max_size=1``), computed in float64.

    Parameters
    ----------
    mel : np.ndarray [shape=(..., frames, bands)]
        Non-negative power spectrogram.
    b : float in (0, 1]
        Smoother weight (:func:`pcen_smoothing`).
    gain, bias, power, eps : float
        As ``librosa.pcen``.
    zi : np.ndarray [shape=(..., 1, bands)], optional
        Smoother state carried from the previous block of the same signal (the ``zf`` this
        function returned for it), so that a signal processed block by block gives the same
        output as processed whole. None = start at the first frame: the state is
        ``(1 - b) S[0]``, as if the signal had been at its first frame forever (librosa starts
        from ``lfilter_zi``, as if it had been at power 1.0: the two differ by a start-up
        transient that decays as ``(1 - b)^t``).

    Returns
    -------
    out : np.ndarray [shape=mel.shape, dtype=float32]
    zf : np.ndarray [shape=(..., 1, bands), dtype=float64]
        Final smoother state (the ``zi`` of the next block).
    """
    from scipy.signal import lfilter

    s = np.asarray(mel, dtype=np.float64)
    if s.shape[-2] == 0:
        return s.astype(np.float32), np.zeros(s.shape[:-2] + (1, s.shape[-1]))
    if zi is None:
        zi = (1.0 - b) * s[..., :1, :]
    smooth, zf = lfilter([b], [1.0, b - 1.0], s, axis=-2, zi=zi)
    # (eps + M)^-gain in log space, as librosa: exp(-gain (log eps + log1p(M / eps)))
    np.divide(smooth, eps, out=smooth)
    np.log1p(smooth, out=smooth)
    smooth += np.log(eps)
    smooth *= -gain
    np.exp(smooth, out=smooth)
    smooth *= s  # S / (eps + M)^gain
    with np.errstate(divide="ignore"):
        if power == 0.0:
            np.log1p(smooth, out=smooth)
        elif bias == 0.0:
            np.power(smooth, power, out=smooth)
        else:
            smooth /= bias
            np.log1p(smooth, out=smooth)
            smooth *= power
            np.expm1(smooth, out=smooth)
            smooth *= bias ** power
    return smooth.astype(np.float32), zf


@dataclass(frozen=True)
class PCENConfig(MelConfig):
    """Config of :class:`PCENExtractor`."""

    time_constant: float = param(0.4, "time constant of the smoother in seconds", kind=float,
                                 low=0.0, low_open=True)
    gain: float = param(0.98, "gain control exponent alpha (0 = none, 1 = full)", kind=float,
                        low=0.0)
    bias: float = param(2.0, "bias delta added before the root compression", kind=float, low=0.0)
    power: float = param(0.5, "root compression exponent r (0 = log1p)", kind=float, low=0.0)
    eps: float = param(1e-6, "floor of the smoothed energy", kind=float, low=0.0, low_open=True)


@register_extractor
class PCENExtractor(MelExtractor):
    """Per-channel energy normalised mel power (librosa.pcen of the mel spectrogram)."""

    name = "pcen"
    config_type = PCENConfig
    log = False
    config: PCENConfig

    def smoothing(self, rate: int) -> float:
        """Smoother weight ``b`` at ``rate`` (see :func:`pcen_smoothing`)."""
        return pcen_smoothing(self.config.time_constant, self.frame_shift(rate))

    def extract_batch(self, x: np.ndarray, rate: int) -> np.ndarray:
        """The mel power of each signal (:class:`MelExtractor`), then :func:`pcen` over its frames."""
        return self.normalize(super().extract_batch(x, rate), rate)

    def normalize(self, mel: np.ndarray, rate: int) -> np.ndarray:
        """PCEN of mel power ``(batch, frames, bands)`` extracted by this extractor at ``rate``."""
        c = self.config
        return pcen(mel, self.smoothing(rate), gain=c.gain, bias=c.bias, power=c.power, eps=c.eps)[0]
