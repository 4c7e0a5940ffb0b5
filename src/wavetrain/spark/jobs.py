"""What every Spark job of the engine shares: reducing partial results, and a progress bar fed
by Spark's status tracker."""
from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from wavetrain.progress import progress_counter

__all__ = ["add_lists", "job_progress"]


def add_lists(a: list | None, b: list | None) -> list | None:
    """Element-wise ``+`` of two lists of partial results (``None`` entries and lists are the
    zero): the reduce of a tree aggregation."""
    if a is None:
        return b
    if b is None:
        return a
    return [y if x is None else x if y is None else x + y for x, y in zip(a, b)]


@contextmanager
def job_progress(sc: Any, desc: str, *, enable: bool, unit: str = "task") -> Iterator[None]:
    """Run the jobs started inside under one job group, with a progress bar of their finished
    tasks (polled from Spark's status tracker twice a second)."""
    group = f"wavetrain-{uuid.uuid4().hex[:8]}"
    sc.setJobGroup(group, desc)
    bar = progress_counter(desc=desc, total=None, unit=unit, enable=enable)
    stop = threading.Event()

    def poll() -> None:
        tracker, shown = sc.statusTracker(), 0
        while not stop.wait(0.5):
            done = total = 0
            for job in tracker.getJobIdsForGroup(group):
                info = tracker.getJobInfo(job)
                for stage in (info.stageIds if info else []):
                    s = tracker.getStageInfo(stage)
                    if s is not None:
                        done, total = done + s.numCompletedTasks, total + s.numTasks
            if bar is not None and done > shown:
                bar.total = max(total, done)
                bar.update(done - shown)
                shown = done

    thread = threading.Thread(target=poll, daemon=True) if bar is not None else None
    if thread is not None:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if thread is not None:
            thread.join()
        if bar is not None:
            bar.close()
        sc.setLocalProperty("spark.jobGroup.id", None)
