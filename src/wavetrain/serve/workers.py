"""The threads that decode and classify the requests of ``wavetrain serve``, and what happens to
one whose work outlasts its deadline.

A Python thread cannot be stopped from outside: work past its deadline is asked to stop (the
request's cancel event, checked between chunks of windows) and its answer given up, but a thread
inside a call that never returns (a graph that loops for ever, a blocked library call) stays
busy. :class:`Workers` keeps the server's capacity anyway:

- ``n`` daemon threads take the work in order of submission;
- :meth:`Workers.abandon` gives up a work: not yet started, it is dropped; running, its thread is
  *retired* (it ends once that work returns, if ever) and a new thread takes its place, so that
  ``n`` threads keep serving — as long as at most ``max_stuck`` retired threads are still
  running; beyond that no replacement is started until one of them ends (the memory and CPU a
  stuck work holds stay bounded, and the server answers, if slowly, rather than growing);
- the threads are daemons and :meth:`Workers.shutdown` does not wait for them: a process can
  exit while one of them is stuck (a :class:`concurrent.futures.ThreadPoolExecutor` joins its
  threads at interpreter exit, which never returns then).
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

__all__ = ["Workers"]


class Workers:
    """``n`` daemon threads running submitted calls (see the module notes).

    Parameters
    ----------
    n : int
        Threads serving at a time.
    max_stuck : int or None
        Retired threads still running an abandoned work beyond which no replacement is started
        (default ``n``).
    name : str
        Prefix of the threads' names.
    """

    def __init__(self, n: int, *, max_stuck: int | None = None, name: str = "wavetrain-serve"):
        self.n = n
        self.max_stuck = n if max_stuck is None else max_stuck
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running: dict[Future, threading.Thread] = {}
        self._retired: set[threading.Thread] = set()
        self._live = 0                   # threads serving (not retired)
        self._started = 0
        self._closed = False
        with self._lock:
            for _ in range(n):
                self._spawn()

    # -- state ---------------------------------------------------------------------------------
    @property
    def busy(self) -> int:
        """Works running now (abandoned ones included)."""
        with self._lock:
            return len(self._running)

    @property
    def stuck(self) -> int:
        """Retired threads still running an abandoned work."""
        with self._lock:
            return len(self._retired)

    @property
    def serving(self) -> int:
        """Threads taking new work."""
        with self._lock:
            return self._live

    # -- use ------------------------------------------------------------------------------------
    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """``fn(*args)`` in one of the threads; its future."""
        future: Future = Future()
        if self._closed:
            future.cancel()
            future.set_running_or_notify_cancel()
            return future
        self._queue.put((future, fn, args))
        return future

    def abandon(self, future: Future) -> None:
        """Give up ``future``'s work: dropped if it has not started, its thread retired and replaced
        if it runs (see the module notes); nothing once it is done."""
        with self._lock:
            if future.cancel():
                return
            thread = self._running.get(future)
            if thread is None or thread in self._retired:
                return
            self._retired.add(thread)
            self._live -= 1
            self._refill()

    def shutdown(self) -> None:
        """Drop the work not started and let the threads end; waits for none of them."""
        self._closed = True
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        with self._lock:
            for _ in range(self._live):
                self._queue.put(None)

    # -- threads --------------------------------------------------------------------------------
    def _refill(self) -> None:
        """Start threads up to ``n`` serving while few enough are stuck (under the lock)."""
        while not self._closed and self._live < self.n and len(self._retired) <= self.max_stuck:
            self._spawn()

    def _spawn(self) -> None:
        self._started += 1
        self._live += 1
        threading.Thread(target=self._serve, name=f"{self.name}-{self._started}", daemon=True).start()

    def _serve(self) -> None:
        me = threading.current_thread()
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args = item
            with self._lock:                # started and registered at once, as abandon() sees them
                if not future.set_running_or_notify_cancel():
                    continue
                self._running[future] = me
            try:
                future.set_result(fn(*args))
            except BaseException as e:      # noqa: BLE001 - handed to the future's owner
                future.set_exception(e)
            # nothing of the request stays referenced by this thread while it waits for the next
            del fn, args, item
            with self._lock:
                self._running.pop(future, None)
                del future
                if me in self._retired:
                    self._retired.discard(me)
                    self._refill()
                    return
