"""What every Spark job of the engine shares: running a task's function on an executor,
reducing partial results, and a progress bar fed by Spark's status tracker.

A task's function runs through :func:`on_executor`. A :class:`~wavetrain.core.errors.WavetrainError`
it raises (a bad parameter, a spec an executor cannot compute) fails the same way on every
attempt, so it is not raised there, where Spark would retry the task ``spark.task.maxFailures``
times and then report a Java stack: it comes back as the task's result, a :class:`TaskError`, which
the reductions pass on (:func:`wavetrain.spark.passes.merging`) and :func:`checked` raises on the
driver as the same error with its one-line message. Any other failure (a lost executor, a read
that timed out) may pass on retry and is left to Spark.
"""
from __future__ import annotations

import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from wavetrain.core import errors
from wavetrain.core.progress import progress_counter

__all__ = ["TaskError", "checked", "job_progress", "on_executor"]


@dataclass(frozen=True)
class TaskError:
    """A :class:`~wavetrain.core.errors.WavetrainError` raised in a task: its class name and message."""

    kind: str
    message: str

    def error(self) -> errors.WavetrainError:
        """The error to raise on the driver (the same class when wavetrain defines it, else a
        :class:`~wavetrain.core.errors.UserError`)."""
        cls = getattr(errors, self.kind, None)
        if isinstance(cls, type) and issubclass(cls, errors.WavetrainError):
            try:
                return cls(self.message)
            except TypeError:
                pass
        return errors.UserError(self.message)


def on_executor(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as a task runs it: SIGINT ignored (the driver cancels the job; a terminal's Ctrl-C
    reaches the local workers too), and a :class:`~wavetrain.core.errors.WavetrainError` returned as a
    :class:`TaskError` instead of raised (not retried)."""

    def run(*args: Any) -> Any:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            return fn(*args)
        except errors.WavetrainError as e:
            return TaskError(type(e).__name__, str(e))

    return run


def checked(result: Any) -> Any:
    """``result`` of a job on the driver; a :class:`TaskError` in it (or in a list of task
    results) is raised.

    Raises
    ------
    WavetrainError
        The first task's error, with its message.
    """
    if isinstance(result, TaskError):
        raise result.error()
    if isinstance(result, list):
        for r in result:
            if isinstance(r, TaskError):
                raise r.error()
    return result


@contextmanager
def job_progress(sc: Any, desc: str, *, enable: bool, unit: str = "task") -> Iterator[None]:
    """Run the jobs started inside under one job group, with a progress bar of their finished
    tasks (polled from Spark's status tracker twice a second). Nested, the outer group is back
    when the inner ends."""
    group = f"wavetrain-{uuid.uuid4().hex[:8]}"
    outer = sc.getLocalProperty("spark.jobGroup.id"), sc.getLocalProperty("spark.job.description")
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
        if outer[0]:
            sc.setJobGroup(outer[0], outer[1] or "")
        else:
            sc.setLocalProperty("spark.jobGroup.id", None)
