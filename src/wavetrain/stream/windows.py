"""Windowing: how a recording's feature gram is cut into clips (windows).

Features are computed once per recording (so the feature store can serve any clip setting);
clips are then frame ranges of that gram, their boundaries snapped to the feature frame shift.
``clip_ms=0`` makes each recording (or metadata segment) a single window. :func:`cut_windows` is
pure — a gram in, windows out, padding included — so samples that never touched a file (a
server's upload, a live stream) are cut exactly as recordings are.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from wavetrain.core.errors import ParameterError
from wavetrain.features import FeatureSpec, extract

PAD_MODES = ("none", "zero", "duplicate", "keep")


@dataclass(frozen=True)
class Windowing:
    """Clip settings.

    Attributes
    ----------
    clip_ms : int
        Clip length in ms; 0 = whole recording.
    shift_ms : int
        Step between clip starts in ms; 0 = back to back (= ``clip_ms``).
    pad : {'none', 'zero', 'duplicate', 'keep'}
        A last clip shorter than ``clip_ms`` is dropped (``none``), completed with zero-signal
        frames (``zero``) or with the recording's frames repeated from its start (``duplicate``).
        A recording shorter than one clip is padded the same way (with ``none`` it yields nothing).
        ``keep`` keeps it as it is, shorter: what a model trained on whole recordings
        (``clip_ms=0``) is given when it is asked for clips (:func:`wavetrain.pipeline.prediction.request_windowing`);
        it is not a training setting.
    """

    clip_ms: int = 0
    shift_ms: int = 0
    pad: str = "zero"

    def __post_init__(self):
        if self.clip_ms < 0 or self.shift_ms < 0:
            raise ParameterError(f"clip_ms/clip_shift_ms: expected >= 0, got {self.clip_ms}/{self.shift_ms}")
        if self.pad not in PAD_MODES:
            raise ParameterError(f"pad: expected one of {', '.join(PAD_MODES)}, got {self.pad!r}")

    @classmethod
    def from_params(cls, params: dict) -> Windowing:
        return cls(int(params.get("clip_ms", 0)), int(params.get("clip_shift_ms", 0)), params.get("pad", "zero"))

    def check_frames(self, frame_shift_s: float, extractor: str = "the features") -> None:
        """Refuse clips of features that have one frame per recording (``frame_shift_s`` 0:
        ``whole=true``, ``window_ms=0`` or a processor that pools over time)."""
        if self.clip_ms and frame_shift_s <= 0:
            raise ParameterError(f"clip_ms={self.clip_ms}: windows need framed features, but {extractor} gives one "
                                 "frame per recording (whole=true, window_ms=0, or pooled over time); use "
                                 "clip_ms=0, or framed features", param="clip_ms")

    def spans(self, n_frames: int, frame_shift_s: float) -> list[tuple[int, int]]:
        """Frame ranges ``[start, stop)`` of the clips; ``stop`` may exceed ``n_frames`` (padding)."""
        if n_frames <= 0:
            return []
        if self.clip_ms == 0:
            return [(0, n_frames)]
        self.check_frames(frame_shift_s)
        clip = max(1, int(round(self.clip_ms / 1000.0 / frame_shift_s)))
        step = max(1, int(round((self.shift_ms or self.clip_ms) / 1000.0 / frame_shift_s)))
        out = []
        start = 0
        while start < n_frames:
            stop = start + clip
            if stop > n_frames:
                if self.pad != "none":
                    out.append((start, stop))
                break
            out.append((start, stop))
            start += step
        return out

    def cut(self, gram: np.ndarray, span: tuple[int, int], silence: np.ndarray | None = None) -> np.ndarray:
        """The clip ``gram[start:stop]``, padded when ``stop > len(gram)`` (a view when not)."""
        start, stop = span
        n = gram.shape[0]
        if stop <= n or self.pad == "keep":
            return gram[start:min(stop, n)]
        part = np.asarray(gram[start:n], dtype=np.float32)
        missing = stop - n
        if self.pad == "duplicate":
            reps = int(np.ceil(missing / n)) if n else 0
            fill = np.concatenate([gram] * reps)[:missing] if reps else np.zeros((missing, gram.shape[1]), np.float32)
        else:
            row = silence if silence is not None else np.zeros(gram.shape[1], np.float32)
            fill = np.broadcast_to(row, (missing, gram.shape[1]))
        return np.concatenate([part, np.asarray(fill, dtype=np.float32)])


@lru_cache(maxsize=16)
def silence_row(spec: FeatureSpec, rate: int) -> np.ndarray:
    """Features of one all-zero sub-window at ``rate`` (``pad=zero`` completes windows with it);
    computed once per spec and rate."""
    n = max(int(rate * 4), 1)  # a few seconds of silence: enough for any sub-window
    g = extract(np.zeros(n, np.float32) if not spec.per_axis else np.zeros((n, 1), np.float32), rate, spec)
    row = np.asarray(g[0], dtype=np.float32)
    row.flags.writeable = False
    return row


def cut_windows(gram: np.ndarray, windowing: Windowing, frame_shift_s: float, duration_ms: int, *,
                silence: Callable[[], np.ndarray] | None = None) -> tuple[list[np.ndarray], list[tuple[int, int]]]:
    """Cut a gram into windows.

    Parameters
    ----------
    gram : np.ndarray [shape=(frames, features)]
        Features of a whole recording (or segment).
    windowing : Windowing
    frame_shift_s : float
        Seconds between frames of ``gram``.
    duration_ms : int
        The recording's duration (window ends are clipped to it).
    silence : callable or None
        Returns the features of silence (e.g. ``lambda: silence_row(spec, rate)``), called only
        when ``pad=zero`` completes a window; zeros when None.

    Returns
    -------
    windows : list of np.ndarray [shape=(clip frames, features)]
        Views of ``gram`` where they fit, padded copies where they run past its end.
    spans : list of (start_ms, end_ms)
        Where each window lies in the recording.
    """
    clip_ms = windowing.clip_ms
    if clip_ms == 0:
        return [gram], [(0, duration_ms)]
    cuts = windowing.spans(gram.shape[0], frame_shift_s)
    row = silence() if silence is not None and windowing.pad == "zero" and cuts and cuts[-1][1] > gram.shape[0] \
        else None
    wins, spans = [], []
    for span in cuts:
        wins.append(windowing.cut(gram, span, row))
        start_ms = int(round(span[0] * frame_shift_s * 1000))
        spans.append((start_ms, min(start_ms + clip_ms, duration_ms)))
    return wins, spans
