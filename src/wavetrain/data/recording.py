"""A :class:`Recording` describes where a sound lives; it never holds the samples."""
from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TypedDict

import numpy as np

from wavetrain.core.signal import resample
from wavetrain.data import file_facts
from wavetrain.data.audio import AudioInfo, read_audio, read_frames, read_info


def file_content_hash(path: str | os.PathLike) -> str:
    """SHA-1 (hex) of a file's bytes, remembered while the file is unchanged
    (:mod:`wavetrain.data.file_facts`: within the run, and across runs next to a feature store)."""
    p = os.path.abspath(path)
    st = os.stat(p)
    seen = time.time_ns()
    digest = file_facts.get(p, st, "sha1")
    if not (isinstance(digest, str) and len(digest) == 40):
        digest = _file_digest(p, "sha1")
        file_facts.put(p, st, "sha1", digest, seen_ns=seen)
    return digest


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 (hex) of a file's bytes (a model file's identity: ``serve``, ``export``)."""
    return _file_digest(path, "sha256")


def _file_digest(path: str | os.PathLike, algorithm: str) -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def format_labels(labels: Mapping[str, str]) -> str:
    """``{'a': '1', 'b': '2'}`` -> ``'a=1;b=2'`` (the metadata.csv form)."""
    return ";".join(f"{k}={v}" for k, v in labels.items())


class _Memo(TypedDict, total=False):
    """What a :class:`Recording` remembers once computed."""

    id: str
    info: AudioInfo


@dataclass(frozen=True, eq=False)
class Recording:
    """One recording, or a segment of one, with its labels and tags.

    Attributes
    ----------
    path : Path
        The audio file.
    labels, tags : Mapping[str, str]
        ``name -> value``. Labels are what models learn; tags are free-form annotations.
    segment_ms : (int, int) or None
        ``[start, end)`` in milliseconds; ``None`` = the whole file.
    source : str or None
        Where this recording was declared (``metadata.csv:12``), for error messages.
    """

    path: Path
    labels: Mapping[str, str] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    segment_ms: tuple[int, int] | None = None
    source: str | None = None
    #: Set in __post_init__ (not an init argument, not compared or printed).
    _cache: _Memo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))
        object.__setattr__(self, "tags", MappingProxyType(dict(self.tags)))
        object.__setattr__(self, "_cache", {})

    # -- identity -------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """Display name: the file name plus ``[start-end]`` for a segment."""
        base = self.path.name
        return f"{base}[{self.segment_ms[0]}-{self.segment_ms[1]}]" if self.segment_ms else base

    @property
    def id(self) -> str:
        """Content identity: a hash of the file's bytes and the segment (stable across renames)."""
        c = self._cache
        if "id" not in c:
            seg = "" if self.segment_ms is None else f"[{self.segment_ms[0]}-{self.segment_ms[1]}]"
            c["id"] = hashlib.sha1((file_content_hash(self.path) + seg).encode()).hexdigest()[:24]
        return c["id"]

    # -- lazy audio -----------------------------------------------------------------------------
    def info(self) -> AudioInfo:
        c = self._cache
        if "info" not in c:
            c["info"] = read_info(self.path)
        return c["info"]

    @property
    def duration_s(self) -> float:
        if self.segment_ms is not None:
            return (self.segment_ms[1] - self.segment_ms[0]) / 1000.0
        return self.info().duration_s

    def known_info(self) -> AudioInfo | None:
        """The header information when it has been read already (no I/O), else None."""
        return self._cache.get("info")

    def known_duration_s(self) -> float | None:
        """The duration when it is known without opening the file (a segment, or a header
        already read), else None."""
        if self.segment_ms is not None:
            return (self.segment_ms[1] - self.segment_ms[0]) / 1000.0
        info = self._cache.get("info")
        return None if info is None else info.duration_s

    def load(self, rate: int | None = None, *, mono: bool = True) -> tuple[np.ndarray, int]:
        """Read the samples (float32), resampled to ``rate`` Hz when given.

        Returns ``(samples, rate)``; samples have shape ``(n,)`` or, with ``mono=False``,
        ``(n, channels)``.
        """
        start_s, stop_s = (0.0, None) if self.segment_ms is None else (
            self.segment_ms[0] / 1000.0, self.segment_ms[1] / 1000.0)
        x, sr = read_audio(self.path, start_s=start_s, stop_s=stop_s, mono=mono, info=self.info())
        if rate is not None and rate != sr:
            x = resample(x.T if x.ndim == 2 else x, sr, rate)
            x = np.ascontiguousarray(x.T if x.ndim == 2 else x, dtype=np.float32)
            sr = rate
        return x, sr

    def block_reader(self):
        """``(read, n, rate)``: ``read(start, stop)`` returns mono float32 samples ``[start, stop)``
        of this recording (segment-relative, native rate) without decoding the rest."""
        info = self.info()
        first = 0 if self.segment_ms is None else int(round(self.segment_ms[0] * info.rate / 1000))
        last = info.frames if self.segment_ms is None else min(
            info.frames, int(round(self.segment_ms[1] * info.rate / 1000)))

        def read(start: int, stop: int) -> np.ndarray:
            return read_frames(self.path, first + start, first + stop, info=info)

        return read, last - first, info.rate

    def __repr__(self) -> str:
        return f"Recording({self.name!r}, labels={format_labels(self.labels)!r})"
