"""Where events lie in a stream: the detector's settings (:class:`EventOptions`) and the rules that
turn activity, frame by frame, into events (:class:`Segmenter`).

Activity comes from the signal (``detector=energy``: :mod:`wavetrain.features.activity`, dB above
an adaptive background floor) or from a model (``detector=model``: a classifier's windows whose
answer is not the ``background`` value). Frames are taken in order, as they arrive:

1. **hysteresis**: an event is a stretch of frames whose activity stays at or above ``off_db``
   and reaches ``on_db`` somewhere (model activity is 1 or 0: both levels are 0.5), from its first
   frame to its last;
2. **gap**: an event that starts less than ``gap_ms`` after the last one ended is merged into it, so
   an event is closed (and reported) ``gap_ms`` after its last active frame;
3. **length**: an event shorter than ``min_ms`` is dropped; one that reaches ``max_ms`` is cut there
   and reported at once (``split``), the rest going on as a new event;
4. **padding** (``pad_ms``, default 0): an event is widened before its start and after its end
   (never into the event before it, nor before the stream's start or past its end).

Memory and latency are bounded: an event is reported at most ``gap_ms`` plus one frame after it
ends, and never needs more than ``max_ms`` plus ``pad_ms`` of samples.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from wavetrain.core.errors import ParameterError
from wavetrain.features.activity import ActivitySettings

__all__ = ["DETECTORS", "EventOptions", "Segmenter", "Span"]

#: dB below ``on_db`` that ``off_db`` lies by default.
OFF_BELOW_ON = 8.0
#: How activity is measured: from the signal's energy, or from a model's windows.
DETECTORS = ("energy", "model")


@dataclass(frozen=True)
class EventOptions:
    """The event detector's settings (see the module notes; :meth:`parse` reads them from text).

    Attributes
    ----------
    detector : {'energy', 'model'}
        Activity from band energies above an adaptive floor, or from a model's windows.
    background : str, optional
        ``detector=model``: the model's value for "no event" (default ``gap``, as ``sound splice
        --gap-label gap`` writes).
    on_db, off_db : float
        ``detector=energy``: activity (dB above its floor of the band that stands out most)
        that starts an event, and below which it ends (default: ``on_db`` less
        :data:`OFF_BELOW_ON`).
    min_ms, gap_ms, max_ms, pad_ms : int
        Shortest event kept, shortest silence between two events (shorter ones are merged),
        longest event (longer ones are cut), and padding added at both ends.
    floor_s : float
        Seconds of the past the background floor comes from: a sound that fills them becomes
        background.
    hop_ms, bands, fmin, smooth :
        The activity's frames (:class:`~wavetrain.features.activity.ActivitySettings`).
    """

    detector: str = "energy"
    background: str | None = None
    on_db: float = 16.0
    off_db: float | None = None
    min_ms: int = 80
    gap_ms: int = 150
    max_ms: int = 10_000
    pad_ms: int = 0
    floor_s: float = 4.0
    hop_ms: int = 10
    bands: int = 16
    fmin: float = 100.0
    smooth: int = 5

    def __post_init__(self):
        if self.detector not in DETECTORS:
            raise ParameterError(f"detector={self.detector!r}: expected {' or '.join(DETECTORS)}", param="detector")
        if self.background is not None and self.detector != "model":
            raise ParameterError("background: names the model's value for no event, with detector=model",
                                 param="background")
        if not (np.isfinite(self.on_db) and np.isfinite(self.off) and 0 <= self.off <= self.on_db):
            raise ParameterError(f"on_db={self.on_db}, off_db={self.off:g}: expected 0 <= off_db <= on_db",
                                 param="on_db")
        for name, low, high in (("min_ms", 0, 600_000), ("gap_ms", 0, 60_000), ("max_ms", 100, 600_000),
                                ("pad_ms", 0, 10_000)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ParameterError(f"{name}={value!r}: expected whole milliseconds {low} to {high}", param=name)
        if self.min_ms > self.max_ms:
            raise ParameterError(f"min_ms={self.min_ms} > max_ms={self.max_ms}: no event could be kept",
                                 param="min_ms")
        if self.pad_ms > self.gap_ms:
            raise ParameterError(f"pad_ms={self.pad_ms} > gap_ms={self.gap_ms}: an event is reported gap_ms after "
                                 "it ends, so its padding after the end must fit in the gap", param="pad_ms")
        _ = self.activity                        # checks the activity's settings

    @property
    def off(self) -> float:
        """The level below which an event ends: ``off_db``, by default ``on_db`` less
        :data:`OFF_BELOW_ON` (at least 0)."""
        return float(self.off_db) if self.off_db is not None else max(0.0, self.on_db - OFF_BELOW_ON)

    @property
    def activity(self) -> ActivitySettings:
        """The settings of the activity meter (``detector=energy``)."""
        return ActivitySettings(hop_ms=self.hop_ms, bands=self.bands, fmin=self.fmin, floor_s=self.floor_s,
                                smooth=self.smooth)

    @property
    def background_value(self) -> str:
        return self.background or "gap"

    @classmethod
    def parse(cls, text: str | None, *, option: str = "--events") -> EventOptions:
        """Settings from text: empty, ``1``, ``on`` or ``true`` for the defaults, else
        ``name=value`` pairs joined by commas (``gap_ms=300,on_db=8``; ``detector=model``,
        ``background=VALUE``). A one-line :class:`ParameterError` names a bad pair."""
        text = "" if text is None else str(text).strip()
        if text.lower() in ("", "1", "on", "true", "yes"):
            return cls()
        kinds = {f.name: f.type for f in fields(cls)}
        values: dict[str, Any] = {}
        for pair in text.split(","):
            name, sep, value = (s.strip() for s in pair.partition("="))
            if not sep or name not in kinds:
                raise ParameterError(f"{option} {text}: expected name=value pairs joined by commas, names among "
                                     f"{', '.join(kinds)}", param="events")
            kind = str(kinds[name])
            try:
                values[name] = int(value) if kind == "int" else float(value) if "float" in kind else value
            except ValueError:
                raise ParameterError(f"{option} {name}={value}: expected a number", param="events") from None
        return cls(**values)

    def describe(self) -> dict[str, Any]:
        """The settings as JSON (those of the other detector left out)."""
        out = asdict(self)
        drop = ("on_db", "off_db", "floor_s", "hop_ms", "bands", "fmin", "smooth") if self.detector == "model" \
            else ("background",)
        for name in drop:
            out.pop(name)
        if self.detector == "model":
            out["background"] = self.background_value
        else:
            out["off_db"] = self.off
        return out


@dataclass
class Span:
    """An event found, in samples of the stream: ``[start, end)`` with padding; ``split``: it was
    cut at ``max_ms`` (at its end), or is the rest of an event cut so (``continued``)."""

    start: int
    end: int
    split: bool = False
    continued: bool = False


class Segmenter:
    """Events from activity frames, given in order (:meth:`add`; :meth:`finish` at the end of the
    stream), by the rules of the module notes.

    Parameters
    ----------
    options : EventOptions
    rate : int
        Samples per second of the frames' times.
    on, off : float
        Activity levels that start and end an event (the options' ``on_db`` and ``off_db`` for
        energy frames).
    """

    def __init__(self, options: EventOptions, rate: int, on: float, off: float):
        self.options = options
        ms = rate / 1000.0
        self.rate = int(rate)
        self.min_len = int(round(options.min_ms * ms))
        self.gap = int(round(options.gap_ms * ms))
        self.max_len = int(round(options.max_ms * ms))
        self.pad = int(round(options.pad_ms * ms))
        self.on, self.off = on, off
        self._stretch: list | None = None     # [start, reached on] of the stretch at or above off going on
        self._cand: list[int] | None = None   # [start, end] of the event not yet reported
        self._cand_cont = False               # it is the rest of a split event
        self._open = False                    # the candidate's last frame was active (it may go on)
        self._reported_end = 0                # end (padded) of the last event reported
        self._time = 0                        # end of the last frame seen

    def add(self, starts: np.ndarray, ends: np.ndarray, levels: np.ndarray) -> list[Span]:
        """Frames ``[starts[i], ends[i])`` (samples, increasing) with their activity; returns the
        events these frames close, in order."""
        out: list[Span] = []
        if len(levels) == 0:
            return out
        levels = np.asarray(levels, dtype=np.float64)
        above = levels >= self.off
        # stretches of frames at or above the off level; one that reaches the on level is active
        edges = np.diff(np.concatenate([[self._stretch is not None], above]).astype(np.int8))
        ups: list[int] = [int(i) for i in np.flatnonzero(edges == 1)]
        downs: list[int] = [int(i) for i in np.flatnonzero(edges == -1)]
        if self._stretch is not None:
            ups.insert(0, -1)
        for k, a in enumerate(ups):
            closed = k < len(downs)
            b = downs[k] if closed else len(levels)          # frames [a, b) of the stretch
            lo = max(a, 0)
            if a >= 0:
                self._stretch = [int(starts[a]), False]
            assert self._stretch is not None
            if not self._stretch[1]:
                hit = np.flatnonzero(levels[lo:b] >= self.on)
                if hit.size:              # (a stretch below the on level longer than max_ms: its end kept)
                    self._stretch[0] = max(self._stretch[0], int(starts[lo + hit[0]]) - self.max_len)
                    self._stretch[1] = True
            if self._stretch[1] and b > lo:
                self._run(self._stretch[0], int(ends[b - 1]), closed, out)
            elif self._stretch[1] and closed:          # (closed at this block's first frame)
                self._open = False
            if closed:
                self._stretch = None
        self._time = int(ends[-1])
        self._flush(self._time, out)
        return out

    def _run(self, start: int, end: int, closed: bool, out: list[Span]) -> None:
        """An active run ``[start, end)`` (it may go on unless ``closed``)."""
        c = self._cand
        if c is not None and (self._open or start - c[1] < self.gap):
            c[1] = max(c[1], end)                  # the same event goes on, or a short gap: merged
        else:
            if c is not None:
                self._report(out)
            self._cand, self._cand_cont = [start, end], False
        self._open = not closed
        c = self._cand
        assert c is not None
        while c[1] - c[0] >= self.max_len:         # too long: cut, reported at once
            cut = c[0] + self.max_len
            out.append(self._span(c[0], cut, split=True, continued=self._cand_cont, pad_end=False))
            c[0], self._cand_cont = cut, True

    def _flush(self, now: int, out: list[Span]) -> None:
        c = self._cand
        if c is not None and not self._open and now - c[1] >= self.gap:
            self._report(out)

    def _report(self, out: list[Span], end_of_stream: int | None = None) -> None:
        c = self._cand
        assert c is not None
        self._cand = None
        if c[1] - c[0] >= self.min_len or self._cand_cont:
            out.append(self._span(c[0], c[1], continued=self._cand_cont, end_of_stream=end_of_stream))

    def _span(self, start: int, end: int, *, split: bool = False, continued: bool = False, pad_end: bool = True,
              end_of_stream: int | None = None) -> Span:
        a = start if continued else max(0, self._reported_end, start - self.pad)
        b = end + self.pad if pad_end else end
        if end_of_stream is not None:
            b = min(b, end_of_stream)
        self._reported_end = b
        return Span(a, b, split, continued)

    def finish(self, total: int) -> list[Span]:
        """The stream ended after ``total`` samples: the event still open (or waiting out its
        gap) is closed there."""
        out: list[Span] = []
        if self._cand is not None:
            self._cand[1] = min(self._cand[1], total)
            self._report(out, end_of_stream=total)
        self._open = False
        self._stretch = None
        return out

    def keep_from(self) -> int:
        """The first sample an event still to be reported can need (samples before it may be
        forgotten)."""
        keep = self._time - self.gap - self.pad - self.rate      # (a second for the frames)
        if self._stretch is not None:
            keep = min(keep, max(self._stretch[0], self._time - self.max_len) - self.pad)
        if self._cand is not None:
            keep = min(keep, self._cand[0] - (0 if self._cand_cont else self.pad))
        return max(0, keep)
