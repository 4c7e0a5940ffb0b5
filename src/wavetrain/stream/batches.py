"""What a model consumes: :class:`Batch` and the :class:`WindowStream` protocol.

A classifier sees *windows*: feature grams of shape ``(frames, features)``, float32. Training data
arrives as a :class:`WindowStream`, which may be iterated several times (EM passes, epochs) and
yields :class:`Batch` objects; nothing requires the whole data set to be in memory at once.

Besides the members every stream has, a stream may offer optional capabilities, each a protocol
of its own that a model tests with ``isinstance``:

* :class:`CountsFrames` — ``expected_frames()``: how many frames a pass yields, known without I/O
  (the GMM keeps all frames in memory when they fit);
* :class:`SplitsValidation` — ``split_validation(fraction, seed, group_by)``: a held-out part
  (neural models validate on it).

:class:`wavetrain.stream.feature_stream.FeatureStream` and :class:`wavetrain.train.ArrayStream` offer both.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = ["Batch", "CountsFrames", "MappedStream", "SplitsValidation", "WindowStream", "mapped"]


@dataclass
class Batch:
    """A batch of labelled windows.

    Attributes
    ----------
    grams : list of np.ndarray [shape=(frames_i, features), dtype=float32]
        Windows may differ in length.
    y : np.ndarray [shape=(batch,), dtype=int64]
        Label index of each window (-1 = unlabelled).
    refs : list of (int, int, int) or None
        Where each window comes from: recording index in the stream, start and end in ms.
    """

    grams: list[np.ndarray]
    y: np.ndarray
    refs: list[tuple[int, int, int]] | None = None

    def __len__(self) -> int:
        return len(self.grams)


@runtime_checkable
class WindowStream(Protocol):
    """What ``Classifier.fit`` consumes."""

    #: Class values; ``Batch.y`` indexes this list.
    labels: list[str]
    #: Features per frame.
    feature_dim: int
    #: Sample rate (Hz) the features were computed at, when known.
    rate: int | None
    #: Channels of every recording for per-axis features (else None).
    channels: int | None

    def batches(self, *, shuffle: bool = False, seed: int = 0) -> Iterator[Batch]:
        """One pass over the data, in order or shuffled by ``seed``."""
        ...


@runtime_checkable
class CountsFrames(Protocol):
    """A stream that knows, without I/O, how many frames a pass yields."""

    def expected_frames(self) -> int | None:
        """Frames of the labelled windows of one pass; None when not known without I/O."""
        ...


@runtime_checkable
class SplitsValidation(Protocol):
    """A stream that can hold out a validation part."""

    def split_validation(self, fraction: float, seed: int = 0, group_by: str | None = None,
                         strata: Sequence[str] = ()) -> tuple[WindowStream, WindowStream]:
        """``(train, valid)``: about ``fraction`` of the recordings (whole groups with
        ``group_by``) held out, of each combination of the ``strata`` labels' values where the
        stream knows its recordings' labels (a stream that does not refuses ``strata``)."""
        ...


class MappedStream:
    """A :class:`WindowStream` whose windows are another's, each passed through ``fn`` (e.g. an
    ensemble member's columns of the combined features), ``feature_dim`` values per frame; labels
    and refs kept. ``expected_frames`` answers as the underlying stream does (None when it
    cannot); see :func:`mapped` for ``split_validation``."""

    def __init__(self, stream: WindowStream, fn: Callable[[np.ndarray], np.ndarray], feature_dim: int):
        self.stream, self.fn = stream, fn
        self.labels = stream.labels
        self.feature_dim = int(feature_dim)
        self.rate, self.channels = stream.rate, stream.channels

    def batches(self, *, shuffle: bool = False, seed: int = 0) -> Iterator[Batch]:
        fn = self.fn
        for batch in self.stream.batches(shuffle=shuffle, seed=seed):
            yield Batch([fn(g) for g in batch.grams], batch.y, batch.refs)

    def expected_frames(self) -> int | None:
        return self.stream.expected_frames() if isinstance(self.stream, CountsFrames) else None


class _SplittingMappedStream(MappedStream):
    def split_validation(self, fraction: float, seed: int = 0, group_by: str | None = None,
                         strata: Sequence[str] = ()) -> tuple[WindowStream, WindowStream]:
        assert isinstance(self.stream, SplitsValidation)
        train, valid = self.stream.split_validation(fraction, seed, group_by, strata)
        return mapped(train, self.fn, self.feature_dim), mapped(valid, self.fn, self.feature_dim)


def mapped(stream: WindowStream, fn: Callable[[np.ndarray], np.ndarray], feature_dim: int) -> MappedStream:
    """``stream``'s windows through ``fn`` (:class:`MappedStream`); it can hold out validation
    data when ``stream`` can."""
    cls = _SplittingMappedStream if isinstance(stream, SplitsValidation) else MappedStream
    return cls(stream, fn, feature_dim)
