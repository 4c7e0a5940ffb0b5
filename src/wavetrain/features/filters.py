"""Filter matrices: mel filter bank (Slaney/HTK), DCT-II, frequency-bin resizing.

All builders are cached and return read-only float32 arrays.
"""
from __future__ import annotations

import logging
from functools import lru_cache

import numpy as np

__all__ = ["hz_to_mel", "mel_to_hz", "mel_edges", "mel_filters", "mel_blocks", "dct_matrix",
           "resize_matrix", "vtln_warp"]

#: Where the warp of :func:`vtln_warp` bends (Hz above ``fmin`` and below ``fmax``; Kaldi's
#: ``vtln-low`` 100 and ``vtln-high`` -500), at most a quarter of the band each.
VTLN_LOW_HZ = 100.0
VTLN_HIGH_HZ = 500.0


def hz_to_mel(f: np.ndarray | float, htk: bool = False) -> np.ndarray:
    """Hz to mel: Slaney (linear below 1 kHz, log above) or HTK ``2595 log10(1 + f/700)``."""
    f = np.asanyarray(f, dtype=np.float64)
    if htk:
        return 2595.0 * np.log10(1.0 + f / 700.0)
    f_sp = 200.0 / 3
    mels = f / f_sp
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    return np.where(f >= min_log_hz,
                    min_log_mel + np.log(np.maximum(f, min_log_hz) / min_log_hz) / logstep, mels)


def mel_to_hz(m: np.ndarray | float, htk: bool = False) -> np.ndarray:
    """Inverse of :func:`hz_to_mel`."""
    m = np.asanyarray(m, dtype=np.float64)
    if htk:
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)
    f_sp = 200.0 / 3
    freqs = f_sp * m
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), freqs)


def vtln_warp(f: np.ndarray, fmin: float, fmax: float, warp: float) -> np.ndarray:
    """Vocal tract length warp of frequencies ``f`` (Hz) by ``warp``: Kaldi's piecewise-linear
    ``VtlnWarpFreq``. Between the bends ``l = (fmin + a) max(1, warp)`` and ``h = (fmax - b)
    min(1, warp)`` a frequency is divided by ``warp``; below ``l`` and above ``h`` the map is
    linear to ``fmin`` and ``fmax``, which stay where they are (so does anything outside them).
    ``a`` and ``b`` are :data:`VTLN_LOW_HZ` and :data:`VTLN_HIGH_HZ` (Kaldi's defaults), at most a
    quarter of the band each.
    A mel filter bank whose band edges are warped so (``warp`` > 1: every band lower) reads a
    speaker whose formants lie ``warp`` times lower (a longer vocal tract) as it reads the typical
    one."""
    f = np.asarray(f, dtype=np.float64)
    if warp == 1.0:
        return f
    span = fmax - fmin
    low = (fmin + min(VTLN_LOW_HZ, span / 4)) * max(1.0, warp)
    high = (fmax - min(VTLN_HIGH_HZ, span / 4)) * min(1.0, warp)
    f_low, f_high = low / warp, high / warp
    out = np.where(f < low, fmin + (f_low - fmin) * (f - fmin) / (low - fmin),
                   np.where(f < high, f / warp, fmax + (f_high - fmax) * (f - fmax) / (high - fmax)))
    return np.where((f < fmin) | (f > fmax), f, out)


def mel_edges(bands: int, fmin: float, fmax: float, htk: bool, warp: float = 1.0) -> np.ndarray:
    """The ``bands + 2`` edges (Hz, float64) of a mel filter bank's triangles: equally spaced
    in mel from ``fmin`` to ``fmax``, then warped by :func:`vtln_warp`."""
    edges = mel_to_hz(np.linspace(hz_to_mel(fmin, htk), hz_to_mel(fmax, htk), bands + 2), htk)
    return vtln_warp(edges, fmin, fmax, warp)


@lru_cache(maxsize=32)
def mel_filters(rate: int, n_fft: int, bands: int, fmin: float, fmax: float, htk: bool,
                norm: str, warp: float = 1.0) -> np.ndarray:
    """Triangular mel filter bank, same construction as ``librosa.filters.mel``.

    Returns
    -------
    weights : np.ndarray [shape=(bands, n_fft // 2 + 1), dtype=float32]
        Row ``i`` weights the power of each rFFT bin into band ``i``; with ``norm='slaney'``
        each triangle is scaled by ``2 / (f[i+2] - f[i])`` (constant energy per band). ``warp``
        moves the band edges by :func:`vtln_warp` (1: none).
    """
    fftfreqs = np.fft.rfftfreq(n_fft, 1.0 / rate)
    mel_f = mel_edges(bands, fmin, fmax, htk, warp)
    fdiff = np.diff(mel_f)
    ramps = np.subtract.outer(mel_f, fftfreqs)
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    if norm == "slaney":
        weights *= (2.0 / (mel_f[2:bands + 2] - mel_f[:bands]))[:, None]
    empty = int(np.count_nonzero(~weights.any(axis=1)))
    if empty:  # (once per filter bank: the function is cached)
        logging.getLogger(__name__).warning(
            "%d of %d mel bands are empty at %d Hz with an FFT of %d points (bins %.1f Hz apart): those "
            "features are constant; use fewer bands, a longer window_ms or a larger n_fft", empty, bands,
            rate, n_fft, rate / n_fft)
    weights = weights.astype(np.float32)
    weights.flags.writeable = False
    return weights


@lru_cache(maxsize=32)
def mel_blocks(rate: int, n_fft: int, bands: int, fmin: float, fmax: float, htk: bool,
               norm: str, warp: float = 1.0, group: int = 8) -> tuple:
    """The mel matrix split into dense blocks covering only non-zero bin ranges.

    Returns
    -------
    blocks : tuple of (lo, hi, b0, b1, W)
        ``W`` of shape ``(hi - lo, b1 - b0)`` (float32, C-contiguous): bands ``b0:b1`` are
        ``power[:, lo:hi] @ W``.  Bands whose triangles fall between bins are all-zero.
    """
    w = mel_filters(rate, n_fft, bands, fmin, fmax, htk, norm, warp)
    blocks = []
    for b0 in range(0, bands, group):
        b1 = min(bands, b0 + group)
        nz = np.flatnonzero(w[b0:b1].any(axis=0))
        if nz.size == 0:
            continue
        lo, hi = int(nz[0]), int(nz[-1]) + 1
        blk = np.ascontiguousarray(w[b0:b1, lo:hi].T)
        blk.flags.writeable = False
        blocks.append((lo, hi, b0, b1, blk))
    return tuple(blocks)


@lru_cache(maxsize=32)
def mel_blocks_interleaved(*args) -> tuple:
    """:func:`mel_blocks` with each weight row repeated twice (``W2`` of shape
    ``(2 (hi - lo), b1 - b0)``), for squared interleaved re/im spectra:
    ``sq[:, 2 lo:2 hi] @ W2 == (re^2 + im^2)[:, lo:hi] @ W`` without forming the power."""
    out = []
    for lo, hi, b0, b1, w in mel_blocks(*args):
        w2 = np.ascontiguousarray(np.repeat(w, 2, axis=0))
        w2.flags.writeable = False
        out.append((lo, hi, b0, b1, w2))
    return tuple(out)


@lru_cache(maxsize=32)
def dct_matrix(n: int, k: int) -> np.ndarray:
    """DCT-II (orthonormal) as a matrix: ``x @ D == scipy.fft.dct(x, 2, norm='ortho')[..., :k]``.

    Returns
    -------
    D : np.ndarray [shape=(n, k), dtype=float32]
    """
    i = np.arange(n)[:, None]
    j = np.arange(k)[None, :]
    d = np.cos(np.pi * j * (2 * i + 1) / (2.0 * n)) * np.sqrt(2.0 / n)
    d[:, 0] *= np.sqrt(0.5)
    d = d.astype(np.float32)
    d.flags.writeable = False
    return d


@lru_cache(maxsize=32)
def resize_matrix(freqs: tuple[float, float, int], fmin: float, fmax: float,
                  bins: int) -> np.ndarray:
    """Area-weighted resampling of spectrum bins onto ``bins`` equal bands in ``[fmin, fmax]``.

    Parameters
    ----------
    freqs : (f0, df, count)
        Centre of the first input bin (Hz), bin spacing (Hz) and the number of input bins;
        input bin ``j`` covers ``[f0 + (j - 0.5) df, f0 + (j + 0.5) df]``.
    fmin, fmax : float
        Output frequency range in Hz; output band ``i`` covers
        ``[fmin + i w, fmin + (i + 1) w]`` with ``w = (fmax - fmin) / bins``.
    bins : int
        Number of output bins.

    Returns
    -------
    R : np.ndarray [shape=(count, bins), dtype=float32]
        ``spectrum @ R`` is the mean of the (piecewise constant) input spectrum over each
        output band, so a tone at ``f`` peaks in output bin ``floor((f - fmin) / w)``.
    """
    f0, df, count = freqs
    lo_in = f0 + (np.arange(count) - 0.5) * df
    hi_in = lo_in + df
    width = (fmax - fmin) / bins
    lo_out = fmin + np.arange(bins) * width
    hi_out = lo_out + width
    overlap = np.minimum(hi_in[:, None], hi_out[None, :]) - np.maximum(lo_in[:, None],
                                                                        lo_out[None, :])
    r = (np.maximum(overlap, 0.0) / width).astype(np.float32)
    r.flags.writeable = False
    return r
