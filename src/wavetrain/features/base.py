"""Extractor base: common framing config and the chunked, vectorised extraction loop.

Each extractor turns frames ``(m, size)`` into features ``(m, F)`` in a ``_kernel``.  The base
class frames the signals as a stride view, copies at most ``CHUNK_BYTES`` of frames at a time
into one reusable float32 buffer (multiplying by the analysis window on the way for spectral
extractors) and writes each chunk's features straight into the output, so extra memory is
bounded by the chunk, not the signal length.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, cast

import numpy as np

from wavetrain.core.errors import AudioError, ParameterError
from wavetrain.features._params import Config, param
from wavetrain.features.fft import default_rfft, scipy_rfft
from wavetrain.features.framing import frame, frame_count, get_window, window_size, window_step

__all__ = ["FramedConfig", "SpectralConfig", "Extractor", "CHUNK_BYTES", "fft_length", "scipy_rfft"]

#: Bytes of frames processed per chunk (the FFT buffer; intermediate arrays are about 3x this).
CHUNK_BYTES = 1 << 19

_COMMON = ("window_ms", "shift_pct", "whole", "rate", "per_axis")


@dataclass(frozen=True)
class FramedConfig(Config):
    """Sub-window parameters shared by every extractor."""

    trailing: ClassVar[tuple[str, ...]] = _COMMON

    window_ms: float = param(40.0, "sub-window length in ms (0 = whole clip); "
                             "size = round(window_ms * rate / 1000) samples", kind=float, low=0.0)
    shift_pct: float = param(50.0, "frame shift in % of the sub-window (100 = rolling, "
                             "< 100 = sliding)", kind=float, low=0.0, low_open=True, high=100.0)
    whole: bool = param(False, "one sub-window spanning the whole clip", kind=bool)
    rate: int | None = param(None, "sample rate in Hz the signal is resampled to before "
                             "extraction (none = keep the input rate)", kind=int, low=1,
                             optional=True)
    per_axis: bool = param(False, "process each channel (axis) separately and concatenate "
                           "features (default: the caller downmixes)", kind=bool)

    def _check(self) -> None:
        if self.window_ms == 0.0 or self.whole:
            object.__setattr__(self, "whole", True)
            object.__setattr__(self, "window_ms", 0.0)
            object.__setattr__(self, "shift_pct", 100.0)


@dataclass(frozen=True)
class SpectralConfig(FramedConfig):
    """Framing plus an analysis window."""

    trailing: ClassVar[tuple[str, ...]] = ("window_ms", "shift_pct", "whole", "window", "n_fft",
                                           "rate", "per_axis")

    window: str = param("hann", "periodic analysis window", kind=str,
                        choices=("hann", "hamming", "rect"))
    n_fft: int | Literal["fast", "pow2"] | None = param(
        "fast", "FFT length in samples; the windowed sub-window is zero-padded to it. fast = the "
        "smallest 2^a 3^b 5^c >= the sub-window (1800 for 40 ms at 44.1 kHz), pow2 = the next "
        "power of two, none = the sub-window length (no padding)", kind=int, low=1,
        choices=("fast", "pow2"), optional=True)


def fft_length(n_fft: int | Literal["fast", "pow2"] | None, size: int) -> int:
    """FFT length for a sub-window of ``size`` samples under the ``n_fft`` setting.

    ``None`` -> ``size``; ``'fast'`` -> smallest ``2^a 3^b 5^c >= size`` (fast in pocketfft,
    computed here so it never depends on the installed scipy); ``'pow2'`` -> next power of two;
    an integer must be ``>= size``.
    """
    if n_fft is None:
        return size
    if n_fft == "pow2":
        return 1 << max(0, (size - 1).bit_length())
    if n_fft == "fast":
        best = 1 << max(0, (size - 1).bit_length())
        p5 = 1
        while p5 < best:
            p35 = p5
            while p35 < best:
                v = p35
                while v < size:
                    v *= 2
                best = min(best, v)
                p35 *= 3
            p5 *= 5
        return best
    if n_fft < size:
        raise ParameterError(f"n_fft={n_fft} is shorter than the sub-window of {size} samples; "
                             "use n_fft >= the window (or n_fft=fast / none)")
    return int(n_fft)


class Extractor:
    """Base class: a registered extractor (``name``, ``config_type``) built from its config.

    Subclasses implement ``_dim(rate, size)``, ``_state(rate, size)`` and
    ``_kernel(frames, state, out)``.
    """

    name: ClassVar[str] = ""
    config_type: ClassVar[type[FramedConfig]] = FramedConfig
    #: Whether frames are multiplied by ``config.window`` before the kernel.
    windowed: ClassVar[bool] = False

    def __init__(self, config: FramedConfig) -> None:
        self.config = config
        #: Real FFT used by spectral kernels: ``(m, n_fft) float32 -> complex64`` (scipy's
        #: MKL or scipy per ``WAVETRAIN_FFT``, see :mod:`wavetrain.features.fft`;
        #: ``device='cpu-torch'`` swaps in torch's).
        self.rfft = default_rfft

    # ---- geometry -------------------------------------------------------------------------
    def frame_size(self, rate: int, n: int | None = None) -> int:
        """Samples per sub-window at ``rate`` (the clip length ``n`` for whole-clip specs)."""
        if self.config.whole:
            if n is None:
                raise ParameterError(f"{self.name} with whole=true: the frame size is the clip "
                                     "length; pass the number of samples")
            return n
        return window_size(self.config.window_ms, rate)

    def fft_size(self, size: int) -> int:
        """Length of the frame buffer rows: the FFT length for spectral extractors (``size``
        zero-padded to ``n_fft``), ``size`` otherwise."""
        if not self.windowed:
            return size
        # windowed extractors are the spectral ones, whose config_type is a SpectralConfig
        return fft_length(cast(SpectralConfig, self.config).n_fft, size)

    def frame_step(self, rate: int, size: int) -> int:
        return size if self.config.whole else window_step(size, self.config.shift_pct)

    def pad_to(self, n: int, rate: int) -> int:
        """Samples a clip of ``n`` samples at ``rate`` is padded to before framing (``n``: none)."""
        return n

    def n_frames(self, n: int, rate: int) -> int:
        """Frames for ``n`` samples at ``rate`` (after any resampling), padded as :meth:`pad_to` says."""
        if self.config.whole:
            return 1 if n > 0 else 0
        if n <= 0:
            return 0
        size = self.frame_size(rate)
        return frame_count(self.pad_to(n, rate), size, self.frame_step(rate, size))

    def frame_shift(self, rate: int) -> float:
        """Seconds between frames (0.0 for whole-clip specs: one frame)."""
        if self.config.whole:
            return 0.0
        size = self.frame_size(rate)
        return self.frame_step(rate, size) / rate

    def feature_dim(self, rate: int, n: int | None = None) -> int:
        """Features per frame at ``rate`` (``n`` = clip length, needed only when it matters)."""
        return self._dim(rate, self.frame_size(rate, n) if (n or not self.config.whole) else None)

    # ---- subclass hooks -------------------------------------------------------------------
    def _dim(self, rate: int, size: int | None) -> int:
        raise NotImplementedError

    def _state(self, rate: int, size: int) -> Any:
        return None

    def _kernel(self, frames: np.ndarray, state: Any, out: np.ndarray) -> None:
        raise NotImplementedError

    # ---- extraction -----------------------------------------------------------------------
    def extract_batch(self, x: np.ndarray, rate: int) -> np.ndarray:
        """Features of a batch of equally long signals.

        Parameters
        ----------
        x : np.ndarray [shape=(batch, n)]
            Finite samples (any float dtype, any strides), already at the extraction rate.
        rate : int
            Sample rate in Hz.

        Returns
        -------
        feats : np.ndarray [shape=(batch, frames, features), dtype=float32]
        """
        n = x.shape[-1]
        size = self.frame_size(rate, n)
        step = self.frame_step(rate, size)
        if n < size or n == 0:
            raise AudioError(
                f"signal of {n} samples ({n / rate:.4g} s at {rate} Hz) is shorter than one "
                f"{self.name} sub-window of {size} samples ({1000 * size / rate:.4g} ms); "
                "use a shorter window_ms or whole=true")
        frames = frame(x, size, step)  # (B, T, size) view
        batch, count = frames.shape[0], frames.shape[1]
        dim = self._dim(rate, size)
        out = np.empty((batch, count, dim), dtype=np.float32)
        flat = out.reshape(batch * count, dim)
        state = self._state(rate, size)
        # windowed extractors are the spectral ones, whose config_type is a SpectralConfig
        window = get_window(cast(SpectralConfig, self.config).window, size) if self.windowed else None
        width = self.fft_size(size)
        if window is not None and width > size:  # zeros over the padding keep it zero
            window = np.concatenate([window, np.zeros(width - size, np.float32)])
        total = batch * count
        chunk = max(1, min(total, CHUNK_BYTES // (4 * width)))
        buf = np.zeros((chunk, width), dtype=np.float32)
        with np.errstate(over="ignore", invalid="ignore"):  # non-finite output is checked later
            self._run(frames, count, window, buf, size, state, flat, chunk, total)
        return out

    def _run(self, frames, count, window, buf, size, state, flat, chunk, total) -> None:
        pos = 0
        while pos < total:
            m = min(chunk, total - pos)
            # gather frames pos:pos+m (they may span several signals); a copy then one in-place
            # multiply of the contiguous buffer by the zero-padded window is faster than one
            # multiply from the overlapping stride view into the padded rows
            filled = 0
            while filled < m:
                b, t = divmod(pos + filled, count)
                k = min(m - filled, count - t)
                np.copyto(buf[filled:filled + k, :size], frames[b, t:t + k], casting="same_kind")
                filled += k
            if window is not None:
                np.multiply(buf[:m], window, out=buf[:m])
            self._kernel(buf[:m], state, flat[pos:pos + m])
            pos += m
