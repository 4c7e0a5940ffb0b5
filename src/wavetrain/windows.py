"""Windowing: how a recording's feature gram is cut into clips (windows).

Features are computed once per recording (so the feature store can serve any clip setting);
clips are then frame ranges of that gram, their boundaries snapped to the feature frame shift.
``clip_ms=0`` makes each recording (or metadata segment) a single window.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wavetrain.errors import ParameterError

PAD_MODES = ("none", "zero", "duplicate")


@dataclass(frozen=True)
class Windowing:
    """Clip settings.

    Attributes
    ----------
    clip_ms : int
        Clip length in ms; 0 = whole recording.
    shift_ms : int
        Step between clip starts in ms; 0 = back to back (= ``clip_ms``).
    pad : {'none', 'zero', 'duplicate'}
        A last clip shorter than ``clip_ms`` is dropped (``none``), completed with zero-signal
        frames (``zero``) or with the recording's frames repeated from its start (``duplicate``).
        A recording shorter than one clip is padded the same way (with ``none`` it yields nothing).
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
    def from_params(cls, params: dict) -> "Windowing":
        return cls(int(params.get("clip_ms", 0)), int(params.get("clip_shift_ms", 0)), params.get("pad", "zero"))

    def spans(self, n_frames: int, frame_shift_s: float) -> list[tuple[int, int]]:
        """Frame ranges ``[start, stop)`` of the clips; ``stop`` may exceed ``n_frames`` (padding)."""
        if n_frames <= 0:
            return []
        if self.clip_ms == 0:
            return [(0, n_frames)]
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
        if stop <= n:
            return gram[start:stop]
        part = np.asarray(gram[start:n], dtype=np.float32)
        missing = stop - n
        if self.pad == "duplicate":
            reps = int(np.ceil(missing / n)) if n else 0
            fill = np.concatenate([gram] * reps)[:missing] if reps else np.zeros((missing, gram.shape[1]), np.float32)
        else:
            row = silence if silence is not None else np.zeros(gram.shape[1], np.float32)
            fill = np.broadcast_to(row, (missing, gram.shape[1]))
        return np.concatenate([part, np.asarray(fill, dtype=np.float32)])
