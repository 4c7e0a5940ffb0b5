"""The server's worker threads (:class:`wavetrain.serve.workers.Workers`): a work given up is
dropped or its thread replaced, within a bound of stuck threads, and nothing waits for them."""
from __future__ import annotations

import threading

from wavetrain.serve.workers import Workers


def _wait(cond, n: int = 500) -> bool:
    for _ in range(n):
        if cond():
            return True
        threading.Event().wait(0.01)
    return cond()


def test_abandoned_work_is_replaced_up_to_the_stuck_bound():
    workers = Workers(1, max_stuck=1)
    gates = [threading.Event() for _ in range(3)]
    try:
        first = workers.submit(gates[0].wait)
        assert _wait(lambda: workers.busy == 1)
        queued = workers.submit(lambda: "never")
        workers.abandon(first)                  # running: its thread retired, another one started
        assert workers.stuck == 1 and workers.serving == 1
        assert queued.result(10) == "never"      # the new thread takes the queue
        second = workers.submit(gates[1].wait)
        assert _wait(lambda: workers.busy == 2)
        workers.abandon(second)                  # a second stuck thread: beyond the bound, no replacement
        assert workers.stuck == 2 and workers.serving == 0
        third = workers.submit(lambda: 3)
        assert not _wait(third.done, 20)         # nobody serves until a stuck one ends
        gates[0].set()
        assert third.result(10) == 3 and _wait(lambda: workers.stuck == 1)
        assert workers.serving == 1
        pending = workers.submit(gates[2].wait)
        late = workers.submit(lambda: 4)
        workers.abandon(late)                    # not started: dropped
        assert late.cancelled()
        gates[2].set()
        assert pending.result(10) is True
    finally:
        for g in gates:
            g.set()
        workers.shutdown()
    assert _wait(lambda: workers.busy == 0 and workers.stuck == 0)


def test_shutdown_waits_for_nothing_and_drops_queued_work():
    workers = Workers(1)
    gate = threading.Event()
    try:
        running = workers.submit(gate.wait)
        assert _wait(lambda: workers.busy == 1)
        queued = workers.submit(lambda: 1)
        workers.shutdown()                       # returns while a thread is busy
        assert queued.cancelled() and workers.submit(lambda: 2).cancelled()
        assert all(t.daemon for t in threading.enumerate() if t.name.startswith("wavetrain-serve"))
    finally:
        gate.set()
    assert running.result(10) is True
