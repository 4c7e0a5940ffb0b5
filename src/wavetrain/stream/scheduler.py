"""The prefetch scheduler: work done by a small thread pool ahead of its consumer, with
back-pressure, in order, and a measure of how long the consumer waited.

Items (recordings) are handed to the pool in *units*: a group of short items of up to
:data:`GROUP_S` seconds in all (one hand-off per group instead of per item: a thread hand-off
costs about as much as reading a small gram from the store), or one item whose result is already
at hand (no hand-off at all). At most ``prefetch`` units are pending at any time, so memory is
bounded whatever the data. The memory planner reads its constants from here.
"""
from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

__all__ = ["AUTO_WORKERS_MIN_S", "GROUP_S", "Scheduler", "default_prefetch", "default_workers"]

#: Short items go to a worker in groups of up to this many seconds of audio.  A group never holds
#: more than max(GROUP_S, longest item) seconds.
GROUP_S = 8.0
#: Recordings at least this long on average (seconds) get a second worker by default.  Measured
#: on the reference machine (2 vCPUs), extracting every gram once with 2 workers instead of 1:
#: 0.4 s spoken words 1.5 -> 2.0-2.3 s (slower: per-file Python work holds the GIL), 3 s clips
#: 4.3 -> 2.9-3.5 s, 10 s 2.5 -> 2.0-2.2 s, 60 s files 5.4 -> 3.7 s (decoding, hashing and FFTs
#: release it).
AUTO_WORKERS_MIN_S = 2.0

T = TypeVar("T")
R = TypeVar("R")


def default_workers(mean_seconds: float | None) -> int:
    """Workers when none are asked for: 2 for recordings of ``AUTO_WORKERS_MIN_S`` or more on
    average on a machine with 2+ CPUs, else 1 (``mean_seconds`` None: unknown, 1)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return 2 if cpus >= 2 and mean_seconds is not None and mean_seconds >= AUTO_WORKERS_MIN_S else 1


def default_prefetch(workers: int) -> int:
    """Units pending at most for ``workers`` threads: two per worker, at least two."""
    return max(2, 2 * workers)


class Scheduler(Generic[T, R]):
    """Runs ``work`` on groups of items in ``workers`` threads, at most ``prefetch`` units ahead.

    Parameters
    ----------
    work : callable ``(list of items) -> list of results``
        Runs on a worker; one result per item, in order.
    seconds : callable ``item -> float``
        An item's weight for grouping (its duration), known without I/O.
    ready : callable ``item -> result or None``
        The result of an item that is already at hand (in memory), checked when its unit is
        formed; such an item is a unit of its own and never goes to the pool.
    workers, prefetch : int
    """

    def __init__(self, work: Callable[[list[T]], list[R]], *, seconds: Callable[[T], float],
                 ready: Callable[[T], R | None], workers: int = 1, prefetch: int = 4):
        self.work, self.seconds, self.ready = work, seconds, ready
        self.workers = max(1, int(workers))
        self.prefetch = max(1, int(prefetch))
        #: consumer time spent waiting for a unit (the input stall), summed over runs
        self.wait_s = 0.0

    def run(self, items: Iterable[T]) -> Iterator[R]:
        """The results of ``items``, in order."""
        pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="wavetrain-stream")
        units = self._units(iter(items))
        pending: deque[Future | list[R]] = deque()

        def submit_next() -> None:
            unit = next(units, None)
            if unit is not None:
                pending.append(unit if isinstance(unit, list) else pool.submit(self.work, unit[0]))

        try:
            for _ in range(self.prefetch):
                submit_next()
            while pending:
                done = self._collect(pending.popleft())
                submit_next()          # the next unit starts before this one's results are used
                yield from done
        finally:
            for f in pending:
                if isinstance(f, Future):
                    f.cancel()
            pool.shutdown(wait=True, cancel_futures=True)

    def _collect(self, unit: Future | list[R]) -> list[R]:
        if isinstance(unit, list):
            return unit
        t0 = time.perf_counter()
        try:
            return unit.result()
        finally:
            self.wait_s += time.perf_counter() - t0

    def _units(self, it: Iterator[T]) -> Iterator[list[R] | tuple[list[T]]]:
        """Units in order: a result at hand (``[result]``) or a group to work on (``(items,)``)."""
        group: list[T] = []
        seconds = 0.0
        for item in it:
            done = self.ready(item)
            if done is not None:
                if group:                 # the group ends here; the item is a unit of its own
                    yield (group,)
                    group, seconds = [], 0.0
                yield [done]
                continue
            d = self.seconds(item)
            if group and seconds + d > GROUP_S:
                yield (group,)
                group, seconds = [], 0.0
            group.append(item)
            seconds += d
            if seconds >= GROUP_S:
                yield (group,)
                group, seconds = [], 0.0
        if group:
            yield (group,)
