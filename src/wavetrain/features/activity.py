"""Activity per frame: how far a signal's band energies stand above an adaptive background floor.

The signal is cut into frames of ``hop_ms`` (each analysed over two hops, Hann-windowed); each frame's
power is summed into ``bands`` bands spaced evenly on a log-frequency scale from ``fmin`` to the
Nyquist frequency, in dB, and smoothed over ``smooth`` frames. The background floor of each band
follows the quietest part of the recent past, as minimum statistics do, but from quantiles rather
than single frames: the last ``floor_s`` seconds are kept as :data:`SUBWINDOWS` sub-windows, each
summarised by the :data:`QUANTILE` quantile of its levels, and the floor is the lowest of those
summaries. A steady hum, a fan or a noisy room is background (its bands lie about their floors: a
white or pink noise's loudest band is rarely 12 dB above its floor), and anything louder than it
in any band stands out; a sound must fill more than four fifths of every sub-window of ``floor_s``
to raise the floor, so a sound that lasts longer than that becomes background. A frame's activity
is how many dB the band that stands out most lies above its floor (at most :data:`CLIP_DB`): a
broadband sound and a sound confined to one band (a whistle, a tonal alarm) both raise it.

The floor changes only when a sub-window is complete and looks back only, so activity is computed
as samples arrive, with memory bounded by one sub-window's levels whatever the length of the
signal. Only the first second of a stream looks ahead: its floor is its own quantile, so that a
sound at the very start is measured against the background after it too (their activity is
returned once that second has arrived).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import scipy.fft

from wavetrain.core.errors import ParameterError

__all__ = ["CLIP_DB", "ActivityMeter", "ActivitySettings"]

#: Activity is at most this many dB.
CLIP_DB = 30.0
#: Seconds at the start of a stream whose floor is their own quantile (a sound at the very start
#: is measured against the background after it): their activity waits until they have arrived.
WARM_S = 1.0
#: The floor of a band is the lowest, over the sub-windows of the last ``floor_s`` seconds, of
#: this quantile of its levels in the sub-window.
QUANTILE = 0.2
#: Sub-windows the floor's window is kept as (their quantiles: ``SUBWINDOWS x bands`` floats).
SUBWINDOWS = 8
#: The floor of a band never lies below this level (dB re full scale), so digital silence has a floor.
FLOOR_MIN_DB = -120.0


@dataclass(frozen=True)
class ActivitySettings:
    """How activity is measured (see the module notes).

    Attributes
    ----------
    hop_ms : int
        Frame step (a frame is analysed over two steps).
    bands : int
        Log-spaced bands from ``fmin`` to the Nyquist frequency.
    fmin : float
        Lowest frequency of the bands in Hz.
    floor_s : float
        Seconds of the past the background floor comes from.
    smooth : int
        Frames the band levels are averaged over.
    """

    hop_ms: int = 10
    bands: int = 16
    fmin: float = 100.0
    floor_s: float = 4.0
    smooth: int = 3

    def __post_init__(self):
        checks = (("hop_ms", 1 <= self.hop_ms <= 100, "1 to 100 ms"), ("bands", 1 <= self.bands <= 64, "1 to 64"),
                  ("fmin", self.fmin >= 0, ">= 0 Hz"), ("floor_s", 0.2 <= self.floor_s <= 600, "0.2 to 600 s"),
                  ("smooth", 1 <= self.smooth <= 50, "1 to 50 frames"))
        for name, ok, expected in checks:
            if not ok:
                raise ParameterError(f"{name}={getattr(self, name)!r}: expected {expected}", param=name)


class ActivityMeter:
    """Activity of a signal given in blocks (:meth:`push`), frame by frame, as in the module notes.

    Parameters
    ----------
    rate : int
        Sample rate in Hz.
    settings : ActivitySettings

    Attributes
    ----------
    hop : int
        Samples per frame step; frame ``i`` covers samples ``[i * hop, i * hop + 2 * hop)`` and is
        answered once they have all arrived.
    frames : int
        Frames whose samples have all arrived.
    done : int
        Frames whose activity has been returned (those of the first :data:`WARM_S` seconds wait
        until all of them have arrived, or :meth:`flush`).
    delay : int
        Frames the smoothing delays the activity by: frame ``i``'s activity is centred on frame
        ``i - delay``.
    """

    def __init__(self, rate: int, settings: ActivitySettings | None = None):
        s = settings or ActivitySettings()
        self.settings = s
        self.rate = int(rate)
        self.hop = max(1, int(round(rate * s.hop_ms / 1000)))
        n = 2 * self.hop
        self._window = np.hanning(n + 2)[1:-1].astype(np.float32)
        self._window /= np.sqrt(np.sum(self._window ** 2) * n / 2)      # a full-scale sine: about 0 dB
        freqs = np.fft.rfftfreq(n, 1.0 / rate)
        top = rate / 2.0
        low = min(s.fmin, top / 2) if s.fmin > 0 else freqs[1]
        edges = np.geomspace(max(low, freqs[1]), top, s.bands + 1)
        edges[-1] = top + 1.0
        which = np.searchsorted(edges, freqs, side="right") - 1
        weights = np.zeros((freqs.size, s.bands), dtype=np.float32)
        for b in range(s.bands):
            weights[(which == b), b] = 1.0
        used = weights.sum(axis=0) > 0          # bands narrower than one bin at low rates: dropped
        self._weights = np.ascontiguousarray(weights[:, used])
        self.bands = int(used.sum())
        self._pending = np.zeros(0, dtype=np.float32)  # samples not yet in a frame (the last hop's too)
        self.frames = 0
        self.done = 0
        self.delay = (s.smooth - 1) // 2
        self._warm_frames = max(1, int(round(min(WARM_S, s.floor_s) * 1000 / s.hop_ms)))
        self._warm: list[np.ndarray] | None = []
        # floor: the quantiles of complete sub-windows, the lowest of the window's
        sub = max(1, int(round(s.floor_s * 1000 / s.hop_ms / SUBWINDOWS)))
        self._sub = sub
        self._quantiles: deque[np.ndarray] = deque(maxlen=SUBWINDOWS)
        self._floor = np.full(self.bands, np.inf, dtype=np.float32)
        self._cur = np.zeros((sub, self.bands), dtype=np.float32)        # the current sub-window's levels
        self._cur_n = 0
        self._tail = np.zeros((0, self.bands), dtype=np.float32)        # last smooth - 1 frames' levels

    def push(self, x: np.ndarray) -> np.ndarray:
        """Add samples (mono float, any block size); returns the activity (dB) of each frame they
        complete, in order (possibly none)."""
        x = np.asarray(x, dtype=np.float32).reshape(-1)
        buf = np.concatenate([self._pending, x]) if self._pending.size else x
        hop = self.hop
        count = max(0, buf.size // hop - 1)      # frames whose two hops have arrived
        if count == 0:
            self._pending = buf.copy()
            return np.zeros(0, dtype=np.float32)
        frames = np.lib.stride_tricks.sliding_window_view(buf[:(count + 1) * hop], 2 * hop)[::hop]
        self._pending = buf[count * hop:].copy()
        self.frames += count
        out = self._activity(self._levels(frames))
        self.done += len(out)
        return out

    def _levels(self, frames: np.ndarray) -> np.ndarray:
        """Band levels (dB) of frames, smoothed over the last ``smooth`` frames."""
        spec = scipy.fft.rfft(frames * self._window, axis=1, workers=1)     # (float32 in, complex64 out)
        power = spec.real ** 2 + spec.imag ** 2
        bands = (power.astype(np.float32) @ self._weights) + np.float32(10 ** (FLOOR_MIN_DB / 10))
        k = self.settings.smooth
        if k > 1:
            both = np.concatenate([self._tail, bands])
            c = np.cumsum(both, axis=0, dtype=np.float64)
            c = np.concatenate([np.zeros((1, self.bands)), c])
            hi = np.arange(self._tail.shape[0] + 1, both.shape[0] + 1)
            lo = np.maximum(hi - k, 0)
            smoothed = ((c[hi] - c[lo]) / (hi - lo)[:, None]).astype(np.float32)
            self._tail = both[-(k - 1):].copy()
            bands = smoothed
        return (10.0 * np.log10(bands)).astype(np.float32)

    def _activity(self, levels: np.ndarray) -> np.ndarray:
        """Activity of the next frames: the first :data:`WARM_S` seconds' held back until they
        have all arrived (their floor is their own quantile: a sound at the very start of a stream
        is measured against the background after it too)."""
        if self._warm is None:
            return self._track(levels)
        self._warm.append(levels)
        if sum(len(w) for w in self._warm) < self._warm_frames:
            return np.zeros(0, dtype=np.float32)
        rows = np.concatenate(self._warm)
        return np.concatenate([self._release(rows[:self._warm_frames]), self._track(rows[self._warm_frames:])])

    def flush(self) -> np.ndarray:
        """The activity of the frames still held back (a stream shorter than the warm-up); call
        at the end of the stream."""
        if not self._warm:
            self._warm = None
            return np.zeros(0, dtype=np.float32)
        out = self._release(np.concatenate(self._warm))
        self.done += len(out)
        return out

    def _release(self, rows: np.ndarray) -> np.ndarray:
        self._warm = None
        floor = _quantile(rows)
        self._quantiles.append(floor)            # the first second starts the floor's window
        self._floor = floor
        self._track(rows, keep_floor=True)
        return np.clip((rows - floor).max(axis=1), 0.0, CLIP_DB).astype(np.float32)

    def _track(self, levels: np.ndarray, *, keep_floor: bool = False) -> np.ndarray:
        """Each frame's largest band level above its floor, clipped; complete sub-windows join the
        floor's window."""
        out = np.empty(levels.shape[0], dtype=np.float32)
        i = 0
        while i < levels.shape[0]:
            take = min(self._sub - self._cur_n, levels.shape[0] - i)
            part = levels[i:i + take]
            out[i:i + take] = np.clip((part - self._floor).max(axis=1), 0.0, CLIP_DB)
            self._cur[self._cur_n:self._cur_n + take] = part
            self._cur_n += take
            i += take
            if self._cur_n == self._sub:         # a sub-window complete: its quantile joins the window
                self._quantiles.append(_quantile(self._cur))
                if not keep_floor:
                    self._floor = np.min(np.stack(self._quantiles), axis=0)
                self._cur_n = 0
        return out


def _quantile(rows: np.ndarray) -> np.ndarray:
    """The :data:`QUANTILE` quantile of each column (the lower of the two values around it)."""
    k = int(QUANTILE * (rows.shape[0] - 1))
    return np.partition(rows, k, axis=0)[k].astype(np.float32)
