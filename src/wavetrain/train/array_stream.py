"""An in-memory (or memory-mapped) :class:`~wavetrain.stream.batches.WindowStream`.

:class:`ArrayStream` holds a list of feature grams and their label indices. It is what tests and
benchmarks feed to ``Classifier.fit``; it offers the same methods as
:class:`wavetrain.stream.feature_stream.FeatureStream` (``batches``, ``split_validation``). The grams may be
``np.memmap`` views (e.g. from ``np.load(path, mmap_mode="r")``): they are only read when a batch
is built. numpy only; no torch.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from wavetrain.core.errors import ParameterError
from wavetrain.stream.batches import Batch


class ArrayStream:
    """Labelled windows held as arrays.

    Parameters
    ----------
    grams : sequence of np.ndarray [shape=(frames_i, features)] or np.ndarray [shape=(n, frames, features)]
        One gram per window; may differ in length. Converted to float32 when a batch is built.
    y : sequence of int [shape=(n,)]
        Label index of each window into ``labels``.
    labels : list of str
        Class names.
    batch_size : int > 0, default=64
        Windows per yielded :class:`Batch`.
    groups : sequence of hashable [shape=(n,)], optional
        Recording (or speaker, ...) of each window; ``split_validation`` never splits a group.
        Default: every window is its own group.

    Examples
    --------
    >>> import numpy as np
    >>> s = ArrayStream([np.zeros((5, 3), np.float32)] * 4, [0, 1, 0, 1], ["a", "b"], batch_size=3)
    >>> [len(b) for b in s.batches()]
    [3, 1]
    """

    def __init__(self, grams: Sequence[np.ndarray] | np.ndarray, y: Sequence[int] | np.ndarray,
                 labels: Sequence[str], *, batch_size: int = 64, groups: Sequence | None = None):
        self.grams = grams
        self.y = np.asarray(y, dtype=np.int64)
        self.labels = list(labels)
        if len(self.grams) != len(self.y):
            raise ParameterError(f"ArrayStream: {len(self.grams)} grams but {len(self.y)} labels")
        if len(self.y) == 0:
            raise ParameterError("ArrayStream: no windows")
        if batch_size < 1:
            raise ParameterError(f"ArrayStream.batch_size: expected an integer >= 1, got {batch_size}")
        self.batch_size = int(batch_size)
        self.groups = list(groups) if groups is not None else None
        if self.groups is not None and len(self.groups) != len(self.y):
            raise ParameterError(f"ArrayStream: {len(self.groups)} groups but {len(self.y)} windows")
        self.feature_dim = int(np.shape(self.grams[0])[1])
        #: Arrays carry no sample rate or channel layout.
        self.rate: int | None = None
        self.channels: int | None = None

    def __len__(self) -> int:
        return len(self.y)

    def expected_frames(self) -> int:
        """Frames of the labelled windows (one pass)."""
        return int(sum(np.shape(g)[0] for g, y in zip(self.grams, self.y) if y >= 0))

    def batches(self, *, shuffle: bool = False, seed: int = 0) -> Iterator[Batch]:
        """One pass over the windows, in order or shuffled by ``seed``."""
        n = len(self.y)
        order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
        for s in range(0, n, self.batch_size):
            idx = order[s:s + self.batch_size]
            yield Batch([np.asarray(self.grams[i], dtype=np.float32) for i in idx], self.y[idx].copy())

    def subset(self, idx: Sequence[int]) -> ArrayStream:
        idx = [int(i) for i in idx]
        return ArrayStream([self.grams[i] for i in idx], self.y[idx], self.labels, batch_size=self.batch_size,
                           groups=[self.groups[i] for i in idx] if self.groups is not None else None)

    def split_validation(self, fraction: float, seed: int = 0, group_by: str | None = None,
                         strata: Sequence[str] = ()) -> tuple[ArrayStream, ArrayStream]:
        """Hold out about ``fraction`` of the windows, whole groups at a time.

        Returns ``(train, valid)``; both keep the full ``labels`` list. ``group_by`` is accepted for
        signature compatibility with ``FeatureStream`` and ignored: the ``groups`` given at
        construction are used. Windows in memory have no recording labels: ``strata`` is refused.
        """
        if strata:
            raise ParameterError(f"windows in memory have no recording labels to hold out by ({', '.join(strata)})")
        if not 0.0 < fraction < 1.0:
            raise ParameterError(f"ArrayStream.split_validation: expected a fraction in (0, 1), got {fraction}")
        groups = self.groups if self.groups is not None else list(range(len(self.y)))
        uniq = list(dict.fromkeys(groups))
        if len(uniq) < 2:
            raise ParameterError("ArrayStream.split_validation: needs at least 2 groups to hold one out")
        rng = np.random.default_rng(seed)
        perm = rng.permutation(len(uniq))
        n_valid = min(len(uniq) - 1, max(1, int(round(fraction * len(uniq)))))
        held = {uniq[i] for i in perm[:n_valid]}
        vi = [i for i, g in enumerate(groups) if g in held]
        ti = [i for i, g in enumerate(groups) if g not in held]
        return self.subset(ti), self.subset(vi)


def synthetic_stream(n_windows: int = 48, n_classes: int = 3, *, features: int = 16, frames: tuple[int, int] = (8, 14),
                     batch_size: int = 16, group_size: int = 2, seed: int = 0, noise: float = 1.0) -> ArrayStream:
    """A small, learnable :class:`ArrayStream` for tests and examples.

    Class ``c`` raises a band of ``features // n_classes`` features by 2; window lengths vary in
    ``frames`` (inclusive low, exclusive high); consecutive ``group_size`` windows share a group.
    """
    rng = np.random.default_rng(seed)
    width = max(1, features // n_classes)
    grams, y = [], []
    for i in range(n_windows):
        c = i % n_classes
        g = (noise * rng.normal(size=(int(rng.integers(frames[0], frames[1])), features))).astype(np.float32)
        g[:, c * width:(c + 1) * width] += 2.0
        grams.append(g)
        y.append(c)
    return ArrayStream(grams, y, [f"class{c}" for c in range(n_classes)], batch_size=batch_size,
                       groups=[i // group_size for i in range(n_windows)])
