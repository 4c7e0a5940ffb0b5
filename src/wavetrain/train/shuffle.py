"""Bounded shuffling and re-batching of a window stream, deterministic in ``(seed, epoch)``.

Memory is bounded by ``buffer`` windows (plus one stream batch and one mini-batch): the stream is
read in its own (seeded) order and each arriving window swaps with a random slot of the buffer.
The order of an epoch depends only on ``(seed, epoch)``, so a resumed run can replay an epoch and
skip the mini-batches it already trained on.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

import numpy as np

from wavetrain.stream.batches import Batch, WindowStream


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """The random generator of one epoch; a pure function of ``(seed, epoch)``."""
    return np.random.default_rng([int(seed) & 0x7FFFFFFF, int(epoch), 0x5EED])


def _own(g: np.ndarray) -> np.ndarray:
    """A window that does not pin a larger array: clips are views of their recording's whole gram,
    and a buffered view would keep the whole gram alive (memory growing with the data)."""
    base = g.base
    if base is not None and getattr(base, "nbytes", 0) > 2 * g.nbytes:
        return np.array(g)
    return g


def balanced_rates(counts: np.ndarray) -> np.ndarray:
    """How many times, on average, a window of each class is drawn per epoch so that every class
    present is drawn equally often and the epoch keeps its length: ``n / (K · n_c)``."""
    counts = np.asarray(counts, dtype=np.float64)
    present = counts > 0
    rates = np.zeros_like(counts)
    rates[present] = counts.sum() / (present.sum() * counts[present])
    return rates


def shuffled_windows(stream: WindowStream, *, buffer: int, seed: int, epoch: int,
                     shuffle: bool = True, class_rates: np.ndarray | None = None
                     ) -> Iterator[tuple[np.ndarray, int]]:
    """Yield ``(gram, label)`` pairs of one epoch through a shuffle buffer of ``buffer`` windows.

    Unlabelled windows (label ``-1``) are skipped. With ``shuffle=False`` the stream order is kept.
    With ``class_rates`` (:func:`balanced_rates`) a window of class c is drawn ``rate_c`` times on
    average (the integer part always, the fraction at random): rare classes are repeated and common
    ones thinned, as a balanced sampler, still in one streaming pass.
    """
    rng = epoch_rng(seed, epoch)
    stream_seed = int(rng.integers(0, 2**31 - 1))
    draw = np.random.default_rng([int(seed) & 0x7FFFFFFF, int(epoch), 0xBA1])

    def copies(y: int) -> int:
        if class_rates is None:
            return 1
        r = float(class_rates[y])
        return int(r) + int(draw.random() < r - int(r))

    if not shuffle or buffer <= 1:
        for b in stream.batches(shuffle=shuffle, seed=stream_seed):
            for g, y in zip(b.grams, b.y):
                if y >= 0:
                    for _ in range(copies(int(y))):
                        yield g, int(y)
        return
    buf: list[tuple[np.ndarray, int]] = []
    for b in stream.batches(shuffle=True, seed=stream_seed):
        for g, y in zip(b.grams, b.y):
            if y < 0:
                continue
            for _ in range(copies(int(y))):
                if len(buf) < buffer:
                    buf.append((_own(g), int(y)))
                    continue
                j = int(rng.integers(0, buffer))
                out, buf[j] = buf[j], (_own(g), int(y))
                yield out
    for j in rng.permutation(len(buf)):
        yield buf[j]


def batches_per_epoch(n_windows: int, batch_size: int) -> int:
    """Mini-batches :func:`minibatches` yields for ``n_windows`` labelled windows."""
    full, rest = divmod(int(n_windows), int(batch_size))
    return full + (1 if rest >= min(2, batch_size) else 0)


def minibatches(windows: Iterator[tuple[np.ndarray, int]], batch_size: int) -> Iterator[Batch]:
    """Group windows into :class:`Batch` objects of ``batch_size``.

    A last batch of one window is dropped when ``batch_size > 1`` (batch-norm cannot train on it).
    """
    grams: list[np.ndarray] = []
    ys: list[int] = []
    for g, y in windows:
        grams.append(g)
        ys.append(y)
        if len(grams) == batch_size:
            yield Batch(grams, np.asarray(ys, dtype=np.int64))
            grams, ys = [], []
    if len(grams) >= min(2, batch_size):
        yield Batch(grams, np.asarray(ys, dtype=np.int64))


class Prefetcher:
    """Run ``source`` in a background thread, keeping at most ``depth`` items ready.

    Items keep their order, so results stay deterministic. The consumer's waiting time is summed
    in :attr:`wait_seconds` (the input-pipeline stall). Exceptions in the producer re-raise in the
    consumer. ``depth=0`` runs the source in the calling thread.
    """

    _END = object()

    def __init__(self, source: Callable[[], Iterator], depth: int = 2):
        self.wait_seconds = 0.0
        self.depth = int(depth)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        if self.depth <= 0:
            self._it = source()
            self._thread = None
            return
        self._q: queue.Queue = queue.Queue(maxsize=self.depth)
        self._thread = threading.Thread(target=self._run, args=(source,), daemon=True,
                                        name="wavetrain-prefetch")
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, source) -> None:
        try:
            for item in source():
                if not self._put(item):
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            self._error = e
        self._put(self._END)

    def __iter__(self):
        return self

    def __next__(self):
        import time

        t0 = time.perf_counter()
        try:
            if self._thread is None:
                return next(self._it)
            item = self._q.get()
            if item is self._END:
                if self._error is not None:
                    raise self._error
                raise StopIteration
            return item
        finally:
            self.wait_seconds += time.perf_counter() - t0

    def close(self) -> None:
        """Stop the producer (it may be blocked on a full queue) and wait for it."""
        self._stop.set()
        if self._thread is not None:
            while self._thread.is_alive():
                try:
                    self._q.get_nowait()
                except queue.Empty:
                    pass
                self._thread.join(timeout=0.05)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
